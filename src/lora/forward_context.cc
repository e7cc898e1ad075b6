#include "lora/forward_context.h"

#include <map>

#include "common/error.h"
#include "lora/cpu_residual.h"
#include "tensor/ops.h"

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
}  // namespace

ScopedContext::ScopedContext(const ForwardContext* ctx) : previous_(g_current) { g_current = ctx; }
ScopedContext::~ScopedContext() { g_current = previous_; }

const ForwardContext* current_context() { return g_current; }

bool active_at(int site) {
  const ForwardContext* c = g_current;
  if (!c || site < 0 || !c->table) return false;
  if (c->token_slots.empty()) return factors_at(c->table->slot(c->uniform_slot), site) != nullptr;
  for (int32_t s : c->token_slots)
    if (factors_at(c->table->slot(s), site)) return true;
  return false;
}

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
