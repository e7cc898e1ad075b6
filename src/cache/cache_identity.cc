#include "cache/cache_identity.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "cache/content_hash.h"
#include "common/error.h"
#include "common/os_error.h"
#include "io/mapped_file.h"
#include "model/model.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;

// Bumped when what a cache state means changes without the inputs below changing (a new layout of a kind).
constexpr const char* kIdentityScheme = "lathe-kv-identity-1";

// Keys that say where a config came from, not what the graph computes.
nlohmann::json without_provenance(nlohmann::json j) {
  if (!j.is_object()) return j;
  for (const char* k : {"_name_or_path", "transformers_version"}) j.erase(k);
  if (j.contains("text_config")) j["text_config"] = without_provenance(j["text_config"]);
  return j;
}

std::string read_if_exists(const fs::path& p) { return fs::exists(p) ? read_text_file(p.string()) : std::string(); }

// Reads up to n bytes at off (short at the end of the file).
std::string read_at(int fd, uint64_t off, size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, out.data() + got, n - got, static_cast<off_t>(off + got));
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  out.resize(got);
  return out;
}

}  // namespace

std::string CacheIdentity::key() const {
  Digest128 d;
  d.add(kIdentityScheme);
  for (const std::string* s :
       {&meta.model_id, &meta.config_fingerprint, &meta.weights_hash, &meta.tokenizer_hash, &meta.template_hash})
    d.add(*s);
  return d.hex();
}

std::string config_fingerprint(const Model& model, const CacheOptions& options) {
  const ModelConfig& c = model.config();
  Digest128 d;
  d.add(kIdentityScheme);
  d.add(c.model_type);
  for (int64_t v : {c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim,
                    c.vocab_size, c.sliding_window, static_cast<int64_t>(c.tie_word_embeddings)})
    d.add_int(v);
  d.add(c.hidden_act);
  for (const std::string& t : c.layer_types) d.add(t);
  for (const auto& [type, r] : c.rope) {
    d.add(type).add(r.type);
    nlohmann::json rj = {r.theta,
                         r.factor,
                         r.low_freq_factor,
                         r.high_freq_factor,
                         r.original_max_position_embeddings,
                         r.partial_rotary_factor};
    d.add(rj.dump());
  }
  if (c.quant_default) d.add_int(c.quant_default->bits).add_int(c.quant_default->group_size);
  for (const auto& [module, q] : c.quant_overrides) {
    d.add(module);
    if (q) d.add_int(q->bits).add_int(q->group_size);
  }
  // Everything else config.json says (softcaps, norms, MoE, KV sharing, ...), canonically: keys sorted.
  d.add(without_provenance(c.root).dump());
  // The KV scheme: without bits the group size does not matter.
  d.add_int(options.kv_bits).add_int(options.kv_bits == 0 ? 0 : options.kv_group_size);
  d.add(dtype_name(c.load.dtype)).add(device_name(c.load.device));
  // A bf16 CPU cache computes different K/V than an f32 one: its entries must not serve the other.
  if (options.kv_bits == 0 && options.cpu_kv_bf16 && c.load.device == Device::CPU) d.add("cpu-kv-bf16");
  return d.hex();
}

std::string weights_hash(const Model& model) {
  const Checkpoint& ck = model.checkpoint();
  std::set<std::string> files;
  for (const std::string& n : ck.names()) files.insert(ck.file_of(n));
  Digest128 d;
  d.add(kIdentityScheme);
  constexpr size_t kSample = 64 << 10;
  for (const std::string& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw OsError(errno, f + ": cannot open to identify the weights");
    const off_t end = ::lseek(fd, 0, SEEK_END);
    const uint64_t size = end < 0 ? 0 : static_cast<uint64_t>(end);
    const std::string len8 = read_at(fd, 0, 8);
    uint64_t hlen = 0;
    for (size_t i = 0; i < len8.size(); ++i) hlen |= static_cast<uint64_t>(static_cast<uint8_t>(len8[i])) << (8 * i);
    hlen = std::min<uint64_t>(hlen, size);
    d.add(fs::path(f).filename().string()).add_int(static_cast<int64_t>(size));
    d.add(read_at(fd, 0, static_cast<size_t>(8 + hlen)));  // the safetensors header: names, dtypes, shapes, offsets
    // Same-shape checkpoints (two fine-tunes of one base) differ in their data: sample its start, middle, end.
    const uint64_t data = 8 + hlen, span = size > data ? size - data : 0;
    for (uint64_t at : {data, data + span / 2, size > kSample ? size - kSample : 0})
      d.add(read_at(fd, std::max(at, data), kSample));
    ::close(fd);
  }
  return d.hex();
}

std::string tokenizer_hash(const std::string& model_dir) {
  Digest128 d;
  d.add(kIdentityScheme).add(read_if_exists(fs::path(model_dir) / "tokenizer.json"));
  // tokenizer_config.json carries added tokens and BOS/EOS handling; its chat template is hashed separately.
  const std::string cfg = read_if_exists(fs::path(model_dir) / "tokenizer_config.json");
  try {
    nlohmann::json j = nlohmann::json::parse(cfg);
    if (j.is_object()) j.erase("chat_template");
    d.add(j.dump());
  } catch (const nlohmann::json::exception&) {
    d.add(cfg);
  }
  return d.hex();
}

std::string template_hash(const std::string& model_dir, const std::string& template_source) {
  Digest128 d;
  d.add(kIdentityScheme);
  if (!template_source.empty()) return d.add("override").add(template_source).hex();
  const fs::path jinja = fs::path(model_dir) / "chat_template.jinja";
  if (fs::exists(jinja)) return d.add("jinja").add(read_text_file(jinja.string())).hex();
  const std::string cfg = read_if_exists(fs::path(model_dir) / "tokenizer_config.json");
  try {
    const nlohmann::json j = nlohmann::json::parse(cfg);
    if (j.is_object() && j.contains("chat_template")) return d.add("config").add(j["chat_template"].dump()).hex();
  } catch (const nlohmann::json::exception&) {
    return d.add("unreadable").add(cfg).hex();
  }
  return d.add("none").hex();
}

CacheIdentity cache_identity(const Model& model, const CacheOptions& options, const std::string& template_source) {
  CacheIdentity id;
  const std::string& dir = model.config().dir;
  id.meta.model_id = fs::path(dir).filename().string();
  if (id.meta.model_id.empty()) id.meta.model_id = fs::path(dir).parent_path().filename().string();
  id.meta.config_fingerprint = config_fingerprint(model, options);
  id.meta.weights_hash = weights_hash(model);
  id.meta.tokenizer_hash = tokenizer_hash(dir);
  id.meta.template_hash = template_hash(dir, template_source);
  return id;
}

std::string adapter_set_hash(const std::vector<AdapterIdentity>& adapters) {
  if (adapters.empty()) return "";
  Digest128 d;
  d.add("adapters");
  for (const AdapterIdentity& a : adapters) d.add(a.content_hash).add(&a.scale, sizeof a.scale);
  return d.hex();
}

std::string cache_namespace(const std::string& adapter_set, const std::string& cache_salt) {
  if (adapter_set.empty() && cache_salt.empty()) return "";
  return Digest128().add("ns").add(adapter_set).add(cache_salt).hex();
}

}  // namespace lathe
