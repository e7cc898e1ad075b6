#include "lora/forward_context.h"

#include <algorithm>
#include <map>

#include "common/error.h"
#include "lora/cpu_residual.h"
#include "lora/device_slot.h"
#include "tensor/ops.h"
#include "tensor/ops_extra.h"

#ifdef LATHE_HAVE_CUDA
#include "tensor/cuda/kernels.h"
#endif

namespace lathe::lora {
namespace {
thread_local const ForwardContext* g_current = nullptr;

const std::vector<const DeviceFactor*>* factors_at(const Slot* s, int site) {
  if (!s || site < 0 || static_cast<size_t>(site) >= s->by_site.size()) return nullptr;
  const auto& f = s->by_site[static_cast<size_t>(site)];
  return f.empty() ? nullptr : &f;
}

// The CPU kernel's factors of a slot at a site; null when the slot has none there or keeps F32 (--exact).
const std::vector<const CpuFactor*>* cpu_factors_at(const Slot* s, int site) {
  if (!s || site < 0 || static_cast<size_t>(site) >= s->cpu_by_site.size()) return nullptr;
  const auto& f = s->cpu_by_site[static_cast<size_t>(site)];
  return f.empty() ? nullptr : &f;
}

// The default CPU path (BF16 factors): every slot group of the forward in one kernel call, added straight into
// y (the kernel sums a row's factors in registers and touches y once, so rows stay independent of the batch).
// False when the table keeps F32 factors.
bool add_residual_cpu(const ForwardContext& c, int site, const Tensor& x_in, Tensor& y) {
  if (y.device() != Device::CPU || y.dtype() != DType::F32 || !y.is_contiguous()) return false;
  const Tensor x = x_in.contiguous();
  const int64_t T = x.dim(0);
  thread_local std::vector<CpuRowGroup> groups;
  thread_local std::vector<std::pair<int32_t, std::vector<int32_t>>> rows;  // slot -> its token rows
  groups.clear();
  if (c.token_slots.empty()) {
    const Slot* s = c.table->slot(c.uniform_slot);
    const auto* f = cpu_factors_at(s, site);
    if (!f) return s && !s->cpu_by_site.empty();
    groups.push_back({f, nullptr, T});
  } else {
    for (auto& r : rows) r.second.clear();
    size_t used = 0;
    for (int64_t t = 0; t < T; ++t) {
      const int32_t slot = c.token_slots[static_cast<size_t>(t)];
      const Slot* s = c.table->slot(slot);
      if (!s) continue;
      if (s->cpu_by_site.empty()) return false;
      if (!cpu_factors_at(s, site)) continue;
      size_t g = 0;
      while (g < used && rows[g].first != slot) ++g;
      if (g == used) {
        if (used == rows.size()) rows.emplace_back();
        rows[used].first = slot;
        rows[used].second.clear();
        ++used;
      }
      rows[g].second.push_back(static_cast<int32_t>(t));
    }
    for (size_t g = 0; g < used; ++g)
      groups.push_back({cpu_factors_at(c.table->slot(rows[g].first), site), rows[g].second.data(),
                        static_cast<int64_t>(rows[g].second.size())});
  }
  if (!groups.empty()) add_cpu_residual(groups, x.data<float>(), x.dim(1), y.data<float>(), y.dim(1));
  return true;
}
// Where each token of a forward finds its slot's device descriptors: one array for all (`uniform`, null when
// every token runs the base model) or a device array of per-token pointers.
struct DeviceRoute {
  const LoraSiteDesc* uniform = nullptr;
  const LoraSiteDesc* const* per_token = nullptr;
  Tensor per_token_holder;               // keeps the uploaded pointer array alive
  std::vector<const DeviceSlot*> slots;  // distinct slots in use
};

// False when some slot in use has no device factors (then the per-module route serves it).
bool device_route(const ForwardContext& c, int64_t T, DeviceRoute& r) {
  r.slots.clear();
  r.uniform = nullptr;
  r.per_token = nullptr;
  auto device_of = [&](int32_t slot, const DeviceSlot*& d) {
    const Slot* s = c.table->slot(slot);
    d = s ? s->device.get() : nullptr;
    return !s || d;
  };
  const DeviceSlot* d = nullptr;
  if (c.token_slots.empty()) {
    if (!device_of(c.uniform_slot, d)) return false;
    if (d) r.slots.push_back(d);
    r.uniform = d ? d->sites() : nullptr;
    return true;
  }
  if (static_cast<int64_t>(c.token_slots.size()) != T) return false;
  thread_local std::vector<const LoraSiteDesc*> host;
  host.resize(static_cast<size_t>(T));
  bool same = true;
  for (int64_t t = 0; t < T; ++t) {
    if (!device_of(c.token_slots[static_cast<size_t>(t)], d)) return false;
    host[static_cast<size_t>(t)] = d ? d->sites() : nullptr;
    if (d && std::find(r.slots.begin(), r.slots.end(), d) == r.slots.end()) r.slots.push_back(d);
    same = same && host[static_cast<size_t>(t)] == host[0];
  }
  if (same) {
    r.uniform = T > 0 ? host[0] : nullptr;
    return true;
  }
#ifdef LATHE_HAVE_CUDA
  // One upload per forward: the site calls of one step reuse it while the pointers stay the same. Kept for the
  // thread's life (never destroyed: a device block freed after the runtime at exit would fault).
  struct Uploaded {
    std::vector<const LoraSiteDesc*> host;
    Tensor dev;
  };
  thread_local auto* up = new Uploaded();
  if (up->host != host) {
    up->dev = Tensor::empty({static_cast<int64_t>(host.size() * sizeof(void*))}, DType::U8, Device::CUDA);
    cuda::upload_async(up->dev.raw(), host.data(), host.size() * sizeof(void*));
    up->host = host;
  }
  r.per_token = static_cast<const LoraSiteDesc* const*>(up->dev.raw());
  r.per_token_holder = up->dev;
  return true;
#else
  return false;
#endif
}

bool any_site_active(const ForwardContext& c, const LoraGroup& g) {
  for (int i = 0; i < g.n; ++i)
    if (g.site[i] >= 0) {
      if (c.token_slots.empty()) {
        if (factors_at(c.table->slot(c.uniform_slot), g.site[i])) return true;
      } else {
        for (int32_t s : c.token_slots)
          if (factors_at(c.table->slot(s), g.site[i])) return true;
      }
    }
  return false;
}

// The shrink of the gathered kernels (tensor/cuda/lora_residual.cu); p.device stays false when this forward
// cannot take them (nothing launched).
void begin_device(const ForwardContext& c, const LoraGroup& g, const Tensor& x_in, PendingResidual& p) {
#ifdef LATHE_HAVE_CUDA
  if (x_in.device() != Device::CUDA || (x_in.dtype() != DType::F32 && x_in.dtype() != DType::BF16)) return;
  const int64_t T = x_in.dim(0);
  DeviceRoute r;
  if (!device_route(c, T, r)) return;
  p.device = true;
  p.uniform = r.uniform;
  p.per_token = r.per_token;
  p.per_token_holder = r.per_token_holder;
  for (const DeviceSlot* d : r.slots)
    for (int i = 0; i < g.n; ++i)
      if (g.site[i] >= 0 && static_cast<size_t>(g.site[i]) < d->rank.size())
        p.rmax = std::max(p.rmax, d->rank[static_cast<size_t>(g.site[i])]);
  if (p.rmax == 0 || T == 0) return;
  // Factors are in the activation type: an input in another type (an F32 residual stream) is converted once.
  p.factor_type = r.slots.front()->dtype;
  p.x = convert(x_in, p.factor_type).contiguous();
  p.u = Tensor::empty({T * g.n * p.rmax}, DType::F32, Device::CUDA);
  p.forked = cuda::lora_shrink(p.factor_type, p.x.raw(), p.x.stride(0), T, p.x.dim(1), p.uniform, p.per_token, g,
                               p.rmax, p.u.data<float>());
#else
  (void)c;
  (void)g;
  (void)x_in;
  (void)p;
#endif
}

// The expand: y += u · Bᵀ into each site's columns.
void finish_device(const PendingResidual& p, Tensor& y) {
  if (p.rmax == 0 || y.dim(0) == 0) return;
#ifdef LATHE_HAVE_CUDA
  if (y.device() != Device::CUDA || y.stride(-1) != 1 || (y.dtype() != DType::F32 && y.dtype() != DType::BF16))
    throw Error(ErrorKind::Internal, "lora: a device residual's output is not a row-major F32 / BF16 device tensor");
  cuda::lora_expand(p.factor_type, y.dtype(), y.raw(), y.stride(0), y.dim(0), p.uniform, p.per_token, p.group, p.rmax,
                    p.u.data<float>(), p.forked);
#else
  (void)y;
#endif
}

}  // namespace

bool group_fusable(const LoraGroup& g, const Tensor& x) {
  const ForwardContext* c = g_current;
  if (!c || !c->table || !any_site_active(*c, g)) return true;
  if (x.device() != Device::CUDA) return false;
  DeviceRoute r;
  return device_route(*c, x.dim(0), r);
}

PendingResidual begin_residual(const LoraGroup& g, const Tensor& x) {
  PendingResidual p;
  p.group = g;
  const ForwardContext* c = g_current;
  if (!c || !c->table || !any_site_active(*c, g)) return p;
  p.active = true;
  begin_device(*c, g, x, p);
  return p;
}

void finish_residual(const PendingResidual& p, const Tensor& x, Tensor& y) {
  if (!p.active) return;
  if (p.device) return finish_device(p, y);
  if (p.group.n != 1)
    throw Error(ErrorKind::Internal, "lora: a fused projection's adapters cannot take the device route");
  add_residual(p.group.site[0], x, y);
}

LoraGroup site_group(int site, int64_t cols) {
  LoraGroup g;
  g.n = 1;
  g.site[0] = site;
  g.cols[0] = cols;
  return g;
}

GraphUse graph_use() {
  GraphUse u;
  const ForwardContext* c = g_current;
  if (!c || !c->table) return u;
  DeviceRoute r;
  bool any = false;
  if (c->token_slots.empty())
    any = c->table->slot(c->uniform_slot) != nullptr;
  else
    for (int32_t s : c->token_slots) any = any || c->table->slot(s) != nullptr;
  if (!any) return u;
  // A captured step bakes in one descriptor array: a uniform slot on the device route only.
  if (!device_route(*c, static_cast<int64_t>(std::max<size_t>(1, c->token_slots.size())), r) || r.per_token) {
    u.ok = false;
    return u;
  }
  u.key = r.uniform;
  u.hold = c->table;
  return u;
}

ScopedContext::ScopedContext(const ForwardContext* ctx) : previous_(g_current) { g_current = ctx; }
ScopedContext::~ScopedContext() { g_current = previous_; }

const ForwardContext* current_context() { return g_current; }

void add_factors(const std::vector<const DeviceFactor*>& factors, const Tensor& x, Tensor& y) {
  for (const DeviceFactor* f : factors) {
    Weight a, b;
    a.dense = f->a;
    b.dense = f->b;
    Tensor u = linear(linear(x, a), b);  // [T, r] then [T, out], in x's type
    if (f->scale != 1.0f) scale_inplace(u, f->scale);
    add_inplace(y, u);
  }
}

// Residuals are summed into an F32 buffer and added to y once, in the uniform and the mixed case alike, so a
// row gets bit-identical output whether it runs alone or gathered with rows on other slots (and so the CUDA
// scatter, which adds into F32, serves BF16 outputs too).
void add_residual(int site, const Tensor& x, Tensor& y) {
  const ForwardContext* c = g_current;
  if (!c || site < 0 || !c->table) return;
  if (add_residual_cpu(*c, site, x, y)) return;
  if (y.device() == Device::CUDA) {
    PendingResidual p;
    p.group = site_group(site, y.dim(1));
    begin_device(*c, p.group, x, p);
    if (p.device) return finish_device(p, y);
  }
  const int64_t T = x.dim(0), N = y.dim(1);
  if (c->token_slots.empty()) {
    if (auto* f = factors_at(c->table->slot(c->uniform_slot), site)) {
      Tensor r = Tensor::zeros({T, N}, DType::F32, y.device());
      add_factors(*f, x, r);
      add_inplace(y, r);
    }
    return;
  }
  if (static_cast<int64_t>(c->token_slots.size()) != T)
    throw Error(ErrorKind::Internal, "lora: the forward context has " + std::to_string(c->token_slots.size()) +
                                         " token slots for " + std::to_string(T) + " tokens");
  std::map<int32_t, std::vector<int32_t>> groups;  // slot -> its token rows (ordered: deterministic)
  for (int64_t t = 0; t < T; ++t) {
    const int32_t s = c->token_slots[static_cast<size_t>(t)];
    if (factors_at(c->table->slot(s), site)) groups[s].push_back(static_cast<int32_t>(t));
  }
  if (groups.empty()) return;
  Tensor delta = Tensor::zeros({T, N}, DType::F32, y.device());
  for (const auto& [s, rows] : groups) {
    const auto& f = *factors_at(c->table->slot(s), site);
    if (static_cast<int64_t>(rows.size()) == T) {
      add_factors(f, x, delta);
      continue;
    }
    const Tensor xs = gather_rows(x, rows);
    Tensor r = Tensor::zeros({xs.dim(0), N}, DType::F32, y.device());
    add_factors(f, xs, r);
    scatter_add_rows(delta, rows, r, std::vector<float>(rows.size(), 1.0f));
  }
  add_inplace(y, delta);
}

}  // namespace lathe::lora
