#include "lora/adapter_manager.h"

#include <algorithm>
#include <cctype>

#include "cache/cache_identity.h"
#include "cache/content_hash.h"
#include "common/error.h"
#include "common/log.h"
#include "lora/adapter_file.h"
#include "lora/cpu_residual.h"
#include "lora/device_slot.h"
#include "model/model.h"

namespace lathe::lora {
namespace {

constexpr int kMaxSpecLength = 4096;

std::string shape2(int64_t out, int64_t in) { return "[" + std::to_string(out) + ", " + std::to_string(in) + "]"; }

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

Tensor to_device(const Tensor& t, Device device, DType dtype) {
  if (device == Device::CPU) return t;  // the CPU computes in F32
  return (t.dtype() == dtype ? t : t.to(dtype)).to(device);
}

// One factor as the prompt cache sees it: where it attaches and what it adds there.
std::string factor_digest(int site, const LoraFactor& f) {
  Digest128 d;
  d.add_int(site);
  for (const Tensor* t : {&f.a, &f.b}) {
    const Tensor c = t->contiguous();
    for (int i = 0; i < c.ndim(); ++i) d.add_int(c.dim(i));
    d.add(c.raw(), c.nbytes());
  }
  d.add(&f.scale, sizeof f.scale);
  return d.hex();
}

}  // namespace

void validate_adapter_id(const std::string& id) {
  if (id.empty() || id.size() > static_cast<size_t>(kMaxAdapterIdLength))
    throw Error(ErrorKind::InvalidArgument,
                "adapter id must be 1.." + std::to_string(kMaxAdapterIdLength) + " characters");
  if (id == "none") throw Error(ErrorKind::InvalidArgument, "adapter id 'none' is reserved (it means the base model)");
  for (char ch : id) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (!(std::isalnum(c) || ch == '.' || ch == '_' || ch == '-' || ch == ':' || ch == '/' || ch == '@'))
      throw Error(ErrorKind::InvalidArgument, "adapter id '" + id + "': character '" + std::string(1, ch) +
                                                  "' is not allowed ('+' and ',' join ids in a request's "
                                                  "adapter spec; use letters, digits and ._-:/@)");
  }
}

AdapterManager::AdapterManager(std::shared_ptr<const LinearSites> sites, Device device, DType dtype, bool cpu_bf16)
    : sites_(std::move(sites)),
      device_(device),
      dtype_(dtype),
      cpu_bf16_(cpu_bf16 && device == Device::CPU),
      table_(std::make_shared<SlotTable>()) {
  if (!sites_) sites_ = std::make_shared<LinearSites>();
}

AdapterManager::AdapterManager(const Model& model)
    : AdapterManager(model.linear_sites(), model.config().load.device, model.config().load.dtype,
                     !model.config().load.exact) {}

static AdapterInfo info_of(const MountedAdapter& a) {
  return {a.id,      a.dir,     a.format,        a.base_model,   a.rank,        a.scale,
          a.modules, a.skipped, a.weights_bytes, a.device_bytes, a.content_hash};
}

std::shared_ptr<MountedAdapter> AdapterManager::build(const std::string& id, const std::string& dir,
                                                      bool upload) const {
  if (sites_->size() == 0)
    throw Error(ErrorKind::Unsupported, "this model's architecture does not take LoRA adapters yet");
  AdapterWeights w = read_adapter(dir);
  auto m = std::make_shared<MountedAdapter>();
  m->id = id;
  m->dir = dir;
  m->format = w.config.format;
  m->base_model = base_model_name(w.config.base_model);
  m->rank = w.config.rank;
  m->scale = w.config.scale;
  m->weights_bytes = w.config.weights_bytes;
  m->skipped = w.skipped;
  size_t matched = 0;
  std::vector<std::pair<int, std::string>> digests;  // (site, factor digest)
  const std::string base_hint = m->base_model.empty() ? "" : " (its config names base '" + m->base_model + "')";
  for (const LoraFactor& f : w.factors) {
    const int site = sites_->find(f.module);
    if (site < 0) {
      const int64_t layer = layer_index(f.module);
      if (layer >= sites_->num_layers())
        throw Error(ErrorKind::InvalidArgument, "adapter '" + id + "': module '" + f.module + "' is in layer " +
                                                    std::to_string(layer) + " but the base model has " +
                                                    std::to_string(sites_->num_layers()) +
                                                    " layers: was it trained for another base model?" + base_hint);
      ++m->skipped;  // outside the linear layers lathe adapts (embeddings, heads, vision towers)
      continue;
    }
    const LinearSite& s = sites_->at(site);
    if (f.in() != s.in || f.out() != s.out)
      throw Error(ErrorKind::InvalidArgument,
                  "adapter '" + id + "': module '" + f.module + "' is " + shape2(f.out(), f.in()) +
                      " [out, in] in the adapter but " + shape2(s.out, s.in) +
                      " in the base model: was it trained for another base model?" + base_hint);
    ++matched;
    if (!upload) continue;
    digests.emplace_back(site, factor_digest(site, f));
    DeviceFactor d;
    d.scale = f.scale;
    if (cpu_bf16_) {
      auto c = std::make_shared<CpuFactor>(make_cpu_factor(f.a, f.b, f.scale));
      m->device_bytes += c->bytes();
      d.cpu = std::move(c);
    } else {
      d.a = to_device(f.a, device_, dtype_);
      d.b = to_device(f.b, device_, dtype_);
      m->device_bytes += d.a.nbytes() + d.b.nbytes();
    }
    m->factors.emplace_back(site, std::move(d));
  }
  if (matched == 0)
    throw Error(ErrorKind::InvalidArgument, "adapter '" + id + "': none of its " + std::to_string(w.factors.size()) +
                                                " modules is a linear layer of the base model" + base_hint);
  m->modules = m->factors.size();
  // Site order, so the file's tensor order (or its format: mlx-lm and PEFT of one adapter) does not matter.
  std::sort(digests.begin(), digests.end());
  Digest128 content;
  content.add("lora-content-1");
  for (const auto& [site, digest] : digests) content.add(digest);
  m->content_hash = content.hex();
  return m;
}

std::string AdapterManager::misfit(const std::string& dir) const {
  try {
    build("check", dir, /*upload=*/false);
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

AdapterInfo AdapterManager::mount(const std::string& id, const std::string& dir) {
  validate_adapter_id(id);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (std::any_of(adapters_.begin(), adapters_.end(), [&](const auto& a) { return a->id == id; }))
      throw Error(ErrorKind::InvalidArgument, "adapter '" + id + "' is already mounted (unmount it first)");
  }
  // Read and validate everything before anything is attached (the lock is not held while reading files).
  auto m = build(id, dir, /*upload=*/true);
  m->modules = m->factors.size();
  std::lock_guard<std::mutex> lock(mu_);
  if (std::any_of(adapters_.begin(), adapters_.end(), [&](const auto& a) { return a->id == id; }))
    throw Error(ErrorKind::InvalidArgument, "adapter '" + id + "' is already mounted (unmount it first)");
  m->serial = next_serial_++;
  adapters_.push_back(m);
  log::info("lora: mounted '" + id + "' from " + dir + " (" + m->format + ", rank " + std::to_string(m->rank) + ", " +
            std::to_string(m->modules) + " modules, " + std::to_string(m->skipped) + " skipped)");
  return info_of(*m);
}

void AdapterManager::unmount(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(adapters_.begin(), adapters_.end(), [&](const auto& a) { return a->id == id; });
  if (it == adapters_.end())
    throw Error(ErrorKind::NotFound, "adapter '" + id + "' is not mounted (mounted: " + mounted_list() + ")");
  adapters_.erase(it);
  auto next = std::make_shared<SlotTable>(*table_);
  for (auto& s : next->slots)
    if (s && std::any_of(s->adapters.begin(), s->adapters.end(), [&](const auto& a) { return a->id == id; })) s.reset();
  table_ = next;
  default_.erase(std::remove(default_.begin(), default_.end(), id), default_.end());
  log::info("lora: unmounted '" + id + "'");
}

std::vector<AdapterInfo> AdapterManager::list() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<AdapterInfo> out;
  for (const auto& a : adapters_) out.push_back(info_of(*a));
  return out;
}

bool AdapterManager::mounted(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::any_of(adapters_.begin(), adapters_.end(), [&](const auto& a) { return a->id == id; });
}

std::string AdapterManager::mounted_list() const {
  if (adapters_.empty()) return "none";
  std::string s;
  for (const auto& a : adapters_) s += (s.empty() ? "" : ", ") + a->id;
  return s;
}

std::vector<std::string> AdapterManager::parse_spec(const std::string& spec_in) const {
  const std::string spec = trim(spec_in);
  if (spec.size() > static_cast<size_t>(kMaxSpecLength))
    throw Error(ErrorKind::InvalidArgument, "adapter spec is " + std::to_string(spec.size()) + " characters (limit " +
                                                std::to_string(kMaxSpecLength) + ")");
  std::vector<std::string> ids;
  if (spec.empty() || spec == "none") return ids;
  size_t start = 0;
  while (true) {
    const size_t end = spec.find_first_of("+,", start);
    const std::string id = trim(spec.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (id.empty()) throw Error(ErrorKind::InvalidArgument, "adapter spec '" + spec + "': an empty id");
    if (!std::any_of(adapters_.begin(), adapters_.end(), [&](const auto& a) { return a->id == id; }))
      throw Error(ErrorKind::NotFound, "adapter '" + id + "' is not mounted (mounted: " + mounted_list() + ")");
    if (std::find(ids.begin(), ids.end(), id) != ids.end())
      throw Error(ErrorKind::InvalidArgument, "adapter spec '" + spec + "' names '" + id + "' twice");
    ids.push_back(id);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return ids;
}

Selection AdapterManager::resolve(const std::string& spec) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool use_default = trim(spec).empty();
  const std::vector<std::string> ids = use_default ? default_ : parse_spec(spec);
  if (ids.empty()) return {table_, -1, ""};
  std::string canon;
  for (const auto& id : ids) canon += (canon.empty() ? "" : "+") + id;
  for (size_t i = 0; i < table_->slots.size(); ++i)
    if (table_->slots[i] && table_->slots[i]->spec == canon) return {table_, static_cast<int>(i), canon};
  auto slot = std::make_shared<Slot>();
  slot->spec = canon;
  slot->by_site.resize(static_cast<size_t>(sites_->size()));
  if (cpu_bf16_) slot->cpu_by_site.resize(static_cast<size_t>(sites_->size()));
  for (const auto& id : ids) {
    const auto& a = *std::find_if(adapters_.begin(), adapters_.end(), [&](const auto& m) { return m->id == id; });
    slot->adapters.push_back(a);
    for (const auto& [site, f] : a->factors) {
      slot->by_site[static_cast<size_t>(site)].push_back(&f);
      if (cpu_bf16_) slot->cpu_by_site[static_cast<size_t>(site)].push_back(f.cpu.get());
    }
  }
  if (device_ == Device::CUDA) slot->device = make_device_slot(slot->by_site);
  auto next = std::make_shared<SlotTable>(*table_);
  size_t free = 0;
  while (free < next->slots.size() && next->slots[free]) ++free;
  if (free == next->slots.size()) {
    if (free >= static_cast<size_t>(kMaxSlots))
      throw Error(ErrorKind::InvalidArgument,
                  "too many distinct adapter sets in use (" + std::to_string(kMaxSlots) + "); unmount some");
    next->slots.emplace_back();
  }
  next->slots[free] = slot;
  table_ = next;
  return {table_, static_cast<int>(free), canon};
}

ForwardContext Selection::context() const {
  ForwardContext c{table, slot, {}, {}};
  if (const Slot* s = table ? table->slot(slot) : nullptr) {
    std::vector<AdapterIdentity> set;
    for (const auto& a : s->adapters) set.push_back({a->content_hash, a->scale});
    c.key = adapter_set_hash(set);
  }
  return c;
}

void AdapterManager::set_default(const std::string& spec) {
  std::lock_guard<std::mutex> lock(mu_);
  default_ = parse_spec(spec);
}

std::string AdapterManager::default_spec() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string s;
  for (const auto& id : default_) s += (s.empty() ? "" : "+") + id;
  return s;
}

std::shared_ptr<const SlotTable> AdapterManager::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_;
}

}  // namespace lathe::lora
