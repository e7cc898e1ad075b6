// The per-forward LoRA context: which slot each token of the current forward uses. Model code never sees it;
// Linear asks add_residual() after its base matmul, which reads the context installed on this thread (none
// installed = the base model, at no cost beyond one thread-local load). The engine installs one per forward:
// a single slot for every token (a solo request, a uniform batch), or one slot per token in the order the
// forward concatenates its rows (a mixed batch: tokens of one slot are gathered, their residual computed once
// per slot, and added back to those rows).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lora/slot_table.h"
#include "tensor/lora_site_desc.h"
#include "tensor/tensor.h"

namespace lathe::lora {

struct ForwardContext {
  std::shared_ptr<const SlotTable> table;
  int uniform_slot = -1;             // used when token_slots is empty
  std::vector<int32_t> token_slots;  // one per token of the forward's input rows (-1 = base)
  // The prompt-cache key of a uniform context: the content hash of its adapter set (each adapter's weights and
  // scale, in stacking order; "" = base), never ids or mount serials. KV computed under one set is reused by
  // the same content mounted under any id or after a restart, and never under another set.
  std::string key;
};

// Installs ctx for this thread until destroyed (nests: the previous context comes back).
class ScopedContext {
 public:
  explicit ScopedContext(const ForwardContext* ctx);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  const ForwardContext* previous_;
};

const ForwardContext* current_context();
// y [T, out] += Σ scale · b·(a·x) over the factors of each token's slot at this site. x: [T, in], the input of
// the base matmul that produced y. No-op without a context.
void add_residual(int site, const Tensor& x, Tensor& y);

// Fused projections on a device (q|k|v, gate|up in one GEMV): true when the current context's residuals at
// group's sites can be added to the fused output (nothing active there, or every slot in use has its factors
// on the device for the gathered kernels), so the fused path stays fused.
bool group_fusable(const LoraGroup& group, const Tensor& x);

// A group's residual split around its base matmul: begin_residual launches the gathered shrink (x · Aᵀ) before
// the matmul, so the matmul's weight prefetch overlaps it; finish_residual adds the expand into the matmul's
// output y [T, Σcols]. Off the device route begin does nothing and finish takes add_residual (one site only:
// a fused group must have passed group_fusable).
struct PendingResidual {
  LoraGroup group;
  bool active = false;  // some token has a factor at some site of the group
  bool device = false;
  const LoraSiteDesc* uniform = nullptr;
  const LoraSiteDesc* const* per_token = nullptr;
  Tensor per_token_holder;
  DType factor_type = DType::F32;
  int32_t rmax = 0;
  bool forked = false;  // the shrink runs on the side stream (captured steps): the expand joins it
  Tensor u;
  Tensor x;  // the shrink's input, kept until the expand (another stream may still read it)
};
PendingResidual begin_residual(const LoraGroup& group, const Tensor& x);
void finish_residual(const PendingResidual& p, const Tensor& x, Tensor& y);
LoraGroup site_group(int site, int64_t cols);  // one site over all of y's columns

// Whether a single-sequence decode step under the current context may run from a captured graph, and what the
// graph is keyed by (the slot's device descriptors; null with no adapter) and must keep alive while it exists.
struct GraphUse {
  bool ok = true;
  const void* key = nullptr;
  std::shared_ptr<const void> hold;
};
GraphUse graph_use();
// The residual of one factor list over all rows of x, added into y (the op itself; CPU and CUDA through the
// dense linear, scale and add ops: the base weight is never dequantized).
void add_factors(const std::vector<const DeviceFactor*>& factors, const Tensor& x, Tensor& y);

}  // namespace lathe::lora
