// The CUDA twin of the training autograd (autograd.h): the same ops with the same signatures and formulas, over
// nodes holding f32 device tensors, forward and backward as kernels queued on the one CUDA stream
// (tensor/cuda/train_kernels.h) and f32 cuBLAS GEMMs (no TF32). It records on the same ag::Tape. Frozen base
// weights stay as the device binds them (quantized ones packed): linear ops dequantize / widen a block of rows
// into scratch at a time. Trainable LoRA factors live on the device (DeviceLora) and accumulate their grads
// there. Only functional in a CUDA build (LATHE_HAVE_CUDA); the engine is lora_engine_cuda.h.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "lab/train/autograd.h"
#include "tensor/ops.h"

namespace lathe::train::dg {

using ag::Gate;
using ag::Tape;

struct Node {
  int64_t rows = 0, cols = 0;
  Tensor value;  // F32 [rows, cols] on the device
  Tensor grad;   // undefined until something adds to it (then zeros + contributions)
  bool requires_grad = false;
  float* g();  // the gradient buffer, zero-filled on first use
  // The gradient in backward, or null when nothing flowed into this node (its op then contributes nothing).
  const float* gy() const { return grad.defined() ? grad.data<float>() : nullptr; }
  int64_t numel() const { return rows * cols; }
  const float* v() const { return value.data<float>(); }
  float* mv() { return value.data<float>(); }
};
using Var = std::shared_ptr<Node>;

Var make_var(int64_t rows, int64_t cols, bool requires_grad);  // value uninitialised
// A node over an existing device F32 tensor [rows, cols] (shared, not copied).
Var leaf(const Tensor& value, bool requires_grad);
Var from_host(const std::vector<float>& values, int64_t rows, int64_t cols, bool requires_grad);
std::vector<float> to_host(const Tensor& t);
// Sets y's gradient to v everywhere (seeding backward).
void seed_grad(const Var& y, float v);

Var embedding(Tape& t, const std::vector<int32_t>& ids, const Weight& table);
Var add(Tape& t, const Var& a, const Var& b);
Var scale(Tape& t, const Var& x, float s);
// weight: F32 [group] on the device, or undefined.
Var rms_norm(Tape& t, const Var& x, const Tensor& weight, float eps, bool plus_one, int64_t group);
// cos / sin of every (row, pair) as ag::rope computes them (f32 angle = pos * inv_freq, times attention_scaling):
// F32 [T, dims / 2, 2] on the device, for rope() below.
Tensor rope_table(const RopeTable& table, const std::vector<int64_t>& positions);
Var rope(Tape& t, const Var& x, const Tensor& cos_sin, int64_t head_dim);
// As ag::AttnShape, with the packed rows' segment starts on the device (I64 [T]) or undefined.
struct AttnShape {
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 1.0f, softcap = 0.0f;
  int64_t window = 0;
  Tensor segment_start;
};
Var attention(Tape& t, const Var& q, const Var& k, const Var& v, const AttnShape& s);
// Which attention kernels run (process-wide): Auto takes the direct kernels below kGemmAttentionRows rows and the
// cuBLAS path (T² scores per head in scratch) from there; the tests pin each.
enum class AttentionPath { Auto, Direct, Gemm };
constexpr int64_t kGemmAttentionRows = 256;
void set_attention_path(AttentionPath p);
Var gated(Tape& t, const Var& gate, const Var& up, Gate act);
// y = x · Wᵀ (+ bias, F32 [out] on the device) through a frozen device weight.
Var linear(Tape& t, const Var& x, const Weight& w, const Tensor* bias = nullptr);
// y = x ⊙ mask (F32 [rows * cols] on the device).
Var masked(Tape& t, const Var& x, const Tensor& mask);

// A trainable LoRA pair on the device: a [r, in], b [out, r], their grads (same shapes), all F32.
struct DeviceLora {
  Tensor a, b, grad_a, grad_b;
  float scale = 1.0f;
};
Var lora(Tape& t, const Var& x, DeviceLora& p);
// As ag::target_logprobs: [T, 1] log-probabilities of the targets (0 where targets[r] < 0) through a frozen head,
// `chunk` vocabulary rows at a time.
Var target_logprobs(Tape& t, const Var& h, const Weight& head, const std::vector<int32_t>& targets, float cap,
                    int64_t chunk = 8192);

}  // namespace lathe::train::dg
