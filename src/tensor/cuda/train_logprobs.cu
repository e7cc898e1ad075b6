// The chunked log-softmax of training's loss head: the logits of one block of vocabulary rows at a time fold into
// each row's running max and sum (online log-sum-exp), so no [T, vocab] buffer exists; backward rebuilds each
// block and turns it into d logp / d logit in place. One thread block per row. Formulas as ag::target_logprobs.
#include <cmath>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/train_kernels.h"
#include "tensor/cuda/train_reduce.cuh"

namespace lathe::cuda::train {
namespace {

constexpr int kLpThreads = 256;

__global__ void tl_block(float* z, int64_t n, int64_t v0, float cap, const int32_t* targets, float* m, float* s,
                         float* tgt) {
  const int64_t r = blockIdx.x;
  float* zr = z + r * n;
  const int32_t id = targets[r];
  float bm = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float v = zr[j];
    if (cap > 0.f) zr[j] = v = tanhf(v / cap) * cap;
    bm = fmaxf(bm, v);
    if (v0 + j == id) tgt[r] = v;
  }
  bm = train_block_max(bm);
  const float old = m[r], mn = fmaxf(old, bm);
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += expf(zr[j] - mn);
  sum = train_block_sum(sum);
  if (threadIdx.x == 0) {
    s[r] = (old == -INFINITY ? 0.f : s[r] * expf(old - mn)) + sum;
    m[r] = mn;
  }
}

__global__ void tl_finish(const float* m, const float* s, const float* tgt, const int32_t* targets, int64_t T,
                          float* lse, float* y) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (r >= T) return;
  lse[r] = m[r] + logf(s[r]);
  y[r] = targets[r] >= 0 ? tgt[r] - lse[r] : 0.f;
}

// d logp_target / d z_j = [j == target] - softmax_j, times gy, times 1 - tanh² through the softcap.
__global__ void tl_block_backward(float* z, int64_t n, int64_t v0, float cap, const int32_t* targets, const float* lse,
                                  const float* gy) {
  const int64_t r = blockIdx.x;
  float* zr = z + r * n;
  const int32_t id = targets[r];
  const float gi = id >= 0 ? gy[r] : 0.f, l = lse[r];
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float v = zr[j], t = 0.f;
    if (cap > 0.f) {
      t = tanhf(v / cap);
      v = t * cap;
    }
    float d = -expf(v - l);
    if (v0 + j == id) d += 1.0f;
    d *= gi;
    if (cap > 0.f) d *= 1.0f - t * t;
    zr[j] = d;
  }
}

}  // namespace

void logprob_block(float* z, int64_t T, int64_t n, int64_t v0, float cap, const int32_t* targets, float* m, float* s,
                   float* tgt) {
  if (T == 0 || n == 0) return;
  tl_block<<<static_cast<unsigned>(T), kLpThreads, 0, stream()>>>(z, n, v0, cap, targets, m, s, tgt);
  check_launch("train logprob_block");
}

void logprob_finish(const float* m, const float* s, const float* tgt, const int32_t* targets, int64_t T, float* lse,
                    float* y) {
  if (T == 0) return;
  tl_finish<<<static_cast<unsigned>((T + 255) / 256), 256, 0, stream()>>>(m, s, tgt, targets, T, lse, y);
  check_launch("train logprob_finish");
}

void logprob_block_backward(float* z, int64_t T, int64_t n, int64_t v0, float cap, const int32_t* targets,
                            const float* lse, const float* gy) {
  if (T == 0 || n == 0) return;
  tl_block_backward<<<static_cast<unsigned>(T), kLpThreads, 0, stream()>>>(z, n, v0, cap, targets, lse, gy);
  check_launch("train logprob_block_backward");
}

}  // namespace lathe::cuda::train
