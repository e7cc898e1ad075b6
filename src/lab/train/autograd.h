// A small reverse-mode autograd on the CPU in f32 for what a decoder's training step needs. Every op is out of
// place: it computes its output from its inputs, and when any input wants a gradient it records a backward
// closure on the tape that adds its inputs' gradients from its output's. Tape::backward runs the closures in
// reverse order. Values are row-major 2-D [rows, cols] f32; per-head ops take the head size and treat each row
// as [heads, head_dim]. Frozen base weights (lathe::Weight, dense or quantized) never get a gradient and are
// never densified whole: linear ops dequantize a block of rows at a time. Trainable LoRA factors accumulate
// straight into their LoraParam's grad tensors.
//
// A CUDA backend slots in behind the same op signatures (a Node holding a device Tensor and each op dispatching
// on it); the engine (lora_engine_cpu.cc) only calls these functions.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "lab/train/lora_gradient.h"
#include "tensor/ops.h"

namespace lathe::train::ag {

struct Node {
  int64_t rows = 0, cols = 0;
  std::vector<float> value;
  std::vector<float> grad;  // empty until something adds to it (then rows * cols)
  bool requires_grad = false;
  float* g() {  // the gradient buffer, zero-filled on first use
    if (grad.empty()) grad.assign(value.size(), 0.0f);
    return grad.data();
  }
  const float* v() const { return value.data(); }
};
using Var = std::shared_ptr<Node>;

class Tape {
 public:
  // recording=false: ops compute values only (inference-style forward with no memory kept for backward).
  explicit Tape(bool recording = true) : recording_(recording) {}
  bool recording() const { return recording_; }
  void record(std::function<void()> backward) {
    if (recording_) steps_.push_back(std::move(backward));
  }
  // Runs every recorded backward, last first, then forgets them. Seed the outputs' grads before calling.
  void backward();
  size_t size() const { return steps_.size(); }

 private:
  bool recording_;
  std::vector<std::function<void()>> steps_;
};

Var make_var(int64_t rows, int64_t cols, bool requires_grad);
Var from_values(std::vector<float> values, int64_t rows, int64_t cols, bool requires_grad);

// Rows of a frozen table (dense or quantized) [vocab, dim]: no gradient flows to the table.
Var embedding(Tape& t, const std::vector<int32_t>& ids, const Weight& table);
Var add(Tape& t, const Var& a, const Var& b);
Var scale(Tape& t, const Var& x, float s);
// RMSNorm over groups of `group` features (group = cols: the whole row; = head_dim: per head q/k norms).
// weight [group] frozen (undefined = weightless); plus_one scales by (1 + w) (Gemma).
Var rms_norm(Tape& t, const Var& x, const Tensor& weight, float eps, bool plus_one, int64_t group);
// Rotate-half RoPE over each head of x [T, heads * head_dim], token r at position positions[r], as
// rope_inplace applies it (f32 angle = pos * inv_freq, cos/sin times attention_scaling).
Var rope(Tape& t, const Var& x, const RopeTable& table, int64_t head_dim, const std::vector<int64_t>& positions);
// Causal softmax attention of one sequence with GQA (query head h reads kv head h / (heads / kv_heads)):
// q [T, heads * D], k/v [T, kv_heads * D]; scores scale * q·k, then softcap (tanh(s / cap) * cap) when cap > 0;
// key j visible to query i when j <= i and, with window > 0, i - j < window.
struct AttnShape {
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 1.0f, softcap = 0.0f;
  int64_t window = 0;
  // Packed rows: row i attends to keys >= segment_start[i] only (block-diagonal causal). nullptr: one segment.
  const std::vector<int64_t>* segment_start = nullptr;
};
Var attention(Tape& t, const Var& q, const Var& k, const Var& v, const AttnShape& s);
enum class Gate { SiLU, GeluTanh };
Var gated(Tape& t, const Var& gate, const Var& up, Gate act);  // act(gate) * up
// y = x · Wᵀ (+ bias) through a frozen weight [out, in]; dx flows back, W gets nothing.
Var linear(Tape& t, const Var& x, const Weight& w, const Tensor* bias = nullptr);
// y = x ⊙ mask (mask [rows * cols], e.g. dropout's 0 or 1 / (1 - p)); dx = dy ⊙ mask.
Var masked(Tape& t, const Var& x, std::shared_ptr<const std::vector<float>> mask);
// y = scale * (x · aᵀ) · bᵀ with trainable a [r, in], b [out, r]; adds into p.grad_a / p.grad_b in backward.
Var lora(Tape& t, const Var& x, LoraParam& p);
// Log-probabilities of targets through a frozen head [vocab, H] (+ final softcap when cap > 0): returns
// [T, 1] with log softmax(h_r · Wᵀ)[targets[r]] where targets[r] >= 0 and 0 elsewhere. Logits are built
// `chunk` vocabulary rows at a time (online log-sum-exp) and rebuilt in backward, so no [T, vocab] buffer ever exists.
Var target_logprobs(Tape& t, const Var& h, const Weight& head, const std::vector<int32_t>& targets, float cap,
                    int64_t chunk = 4096);

// Helpers shared with the engine and tests: C[M, N] (+)= A[M, K] · B[N, K]ᵀ etc. on raw f32.
void gemm_nt(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k, bool accumulate);
void gemm_nn(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k, bool accumulate);
void gemm_tn(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k, bool accumulate);
// Rows [row0, row0 + n) of a frozen weight as f32 [n, in] (dequantized / converted).
Tensor weight_rows(const Weight& w, int64_t row0, int64_t n);

}  // namespace lathe::train::ag
