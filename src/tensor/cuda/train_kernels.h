// Launchers of the kernels behind the CUDA training autograd (lab/train/autograd_cuda.h): forward and backward
// of each op a decoder's LoRA training step needs, over raw f32 device pointers, queued on cuda::stream().
// Backward launchers add into their gradient buffers (the tape accumulates, as the CPU autograd does).
#pragma once
#include <cstdint>

namespace lathe::cuda::train {

// Row-major C[M, N] = alpha · op(A) · op(B) + beta · C in plain f32 (no TF32: gradients are checked against an
// f32 reference). op(A) is [M, K]: A stored [M, K] (lda its row stride), or [K, M] when trans_a; op(B) is [K, N]:
// B stored [K, N], or [N, K] when trans_b.
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
// sgemm over `batch` matrices: batch b reads A + b · sa and B + b · sb and writes C + b · sc.
void sgemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                   int64_t lda, int64_t sa, const float* B, int64_t ldb, int64_t sb, float beta, float* C, int64_t ldc,
                   int64_t sc, int64_t batch);
// The speed mode of sgemm (process-wide; off by default): cuBLAS rounds the f32 inputs to bf16 for the tensor cores
// and accumulates in f32. Gradients then differ from the f32 reference at bf16's precision.
void set_sgemm_bf16(bool on);
bool sgemm_bf16();

// Elementwise (n values).
void fill(float* x, int64_t n, float v);
void add(const float* a, const float* b, float* y, int64_t n);               // y = a + b
void axpy(float* y, const float* x, int64_t n, float alpha);                 // y += alpha · x
void scale(const float* x, float* y, int64_t n, float s);                    // y = s · x
void mul(const float* x, const float* m, float* y, int64_t n);               // y = x ⊙ m
void mul_add(float* g, const float* gy, const float* m, int64_t n);          // g += gy ⊙ m
void gated(const float* g, const float* u, float* y, int64_t n, bool gelu);  // act(g) ⊙ u (SiLU or GELU-tanh)
// gg += gy ⊙ u ⊙ act'(g), gu += gy ⊙ act(g); either may be null.
void gated_backward(const float* g, const float* u, const float* gy, float* gg, float* gu, int64_t n, bool gelu);

// RMSNorm over `groups` consecutive groups of `group` values; w [group] (null: weightless; plus_one: 1 + w).
// inv[groups] receives each group's 1 / rms for backward.
void rms_norm(const float* x, const float* w, bool plus_one, float eps, int64_t groups, int64_t group, float* y,
              float* inv);
void rms_norm_backward(const float* x, const float* w, bool plus_one, const float* inv, const float* gy, int64_t groups,
                       int64_t group, float* gx);

// Rotate-half RoPE over x [T, H, D]: pairs (i, i + half) for i < half rotate by cs[t, i] = (cos, sin); features
// from 2 · half on pass through.
void rope(const float* x, const float* cs, int64_t T, int64_t H, int64_t D, int64_t half, float* y);
void rope_backward(const float* gy, const float* cs, int64_t T, int64_t H, int64_t D, int64_t half, float* gx);

// Causal GQA attention of one sequence: q [T, Hq·D] (row stride qc), k/v [T, Hkv·D] (row stride kc); key j is
// visible to query i when first(i) <= j <= i, first(i) = max(i - window + 1 when window > 0, seg[i] when seg).
struct AttnArgs {
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  int64_t T = 0, Hq = 0, Hkv = 0, D = 0, qc = 0, kc = 0;
  float scale = 1.f, softcap = 0.f;
  int64_t window = 0;
  const int64_t* seg = nullptr;  // device [T] or null
};
// out [T, qc] (written), lse [Hq · T] (per head and query: the log-sum-exp of its scores).
void attention(const AttnArgs& a, float* out, float* lse);
// Adds dq, dk, dv; delta [Hq · T] is scratch.
void attention_backward(const AttnArgs& a, const float* out, const float* lse, const float* gout, float* delta,
                        float* gq, float* gk, float* gv);

// The same attention through cuBLAS: each head's [T, T] scores as a GEMM into scratch, a row kernel for the mask,
// softcap and softmax, and GEMMs for P·V and the gradients (dP = dO·Vᵀ, dV += Pᵀ·dO, dQ += dS·K, dK += dSᵀ·Q).
// O(T²) memory per head, so kv groups go a chunk at a time through scratch of attention_gemm_scratch(a) floats
// (each of s and dp); the cheap path for long sequences. Results equal attention()'s up to f32 rounding order.
int64_t attention_gemm_scratch(const AttnArgs& a);
void attention_gemm(const AttnArgs& a, float* out, float* lse, float* s);
void attention_gemm_backward(const AttnArgs& a, const float* lse, const float* gout, float* s, float* dp, float* gq,
                             float* gk, float* gv);
// Row kernels of the GEMM path over `rows` rows of [T] scores of heads h0.. (row = (h - h0) · T + i): raw scores
// (scale applied, before the softcap) in, probabilities out (0 where masked), lse[h · T + i] out.
void attention_softmax_rows(const AttnArgs& a, int64_t h0, int64_t rows, float* s, float* lse);
// Raw scores and dP in, P into s and dS (d loss / d (q·k), scale and softcap included) into dp.
void attention_softmax_backward_rows(const AttnArgs& a, int64_t h0, int64_t rows, const float* lse, float* s,
                                     float* dp);

// The chunked log-softmax of a frozen head. z [T, n] holds raw logits of vocabulary rows [v0, v0 + n): softcapped
// in place when cap > 0, folded into each row's running max m and sum s (online log-sum-exp), and the target's
// logit (targets[r] in the block) copied to tgt[r].
void logprob_block(float* z, int64_t T, int64_t n, int64_t v0, float cap, const int32_t* targets, float* m, float* s,
                   float* tgt);
// lse = m + log s; y[r] = tgt[r] - lse[r] where targets[r] >= 0, else 0.
void logprob_finish(const float* m, const float* s, const float* tgt, const int32_t* targets, int64_t T, float* lse,
                    float* y);
// z [T, n] raw logits of block v0 in, gy[r] · d logp_r / d z out (in place; the softcap's chain included).
void logprob_block_backward(float* z, int64_t T, int64_t n, int64_t v0, float cap, const int32_t* targets,
                            const float* lse, const float* gy);

}  // namespace lathe::cuda::train
