// Training kernels over f32 values: elementwise ops, the gated activations, RMSNorm and rotate-half RoPE, each
// with its backward (which adds into the gradient). Formulas as the CPU autograd (lab/train/autograd.cc).
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/train_kernels.h"
#include "tensor/cuda/train_reduce.cuh"

namespace lathe::cuda::train {
namespace {

constexpr int kTrainThreads = 256;
constexpr float kTrainGeluC = 0.7978845608028654f;  // sqrt(2 / pi)

// Grid-stride loops: a grid capped at 64k blocks covers any n.
unsigned train_blocks(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>(65535, std::max<int64_t>(1, (n + kTrainThreads - 1) / kTrainThreads)));
}
#define TRAIN_FOR_EACH(i, n) \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); i += int64_t{gridDim.x} * blockDim.x)

__global__ void tk_fill(float* x, int64_t n, float v) { TRAIN_FOR_EACH(i, n) x[i] = v; }
__global__ void tk_add(const float* a, const float* b, float* y, int64_t n) { TRAIN_FOR_EACH(i, n) y[i] = a[i] + b[i]; }
__global__ void tk_axpy(float* y, const float* x, int64_t n, float alpha) { TRAIN_FOR_EACH(i, n) y[i] += alpha * x[i]; }
__global__ void tk_scale(const float* x, float* y, int64_t n, float s) { TRAIN_FOR_EACH(i, n) y[i] = x[i] * s; }
__global__ void tk_mul(const float* x, const float* m, float* y, int64_t n) { TRAIN_FOR_EACH(i, n) y[i] = x[i] * m[i]; }
__global__ void tk_mul_add(float* g, const float* gy, const float* m, int64_t n) {
  TRAIN_FOR_EACH(i, n) g[i] += gy[i] * m[i];
}

// act(g) and, with da, its derivative.
__device__ __forceinline__ float tk_act(float g, bool gelu, float* da) {
  if (!gelu) {
    const float s = 1.0f / (1.0f + expf(-g));
    if (da) *da = s * (1.0f + g * (1.0f - s));
    return g * s;
  }
  const float th = tanhf(kTrainGeluC * (g + 0.044715f * g * g * g));
  if (da) *da = 0.5f * (1.0f + th) + 0.5f * g * (1.0f - th * th) * kTrainGeluC * (1.0f + 3.0f * 0.044715f * g * g);
  return 0.5f * g * (1.0f + th);
}
__global__ void tk_gated(const float* g, const float* u, float* y, int64_t n, bool gelu) {
  TRAIN_FOR_EACH(i, n) y[i] = tk_act(g[i], gelu, nullptr) * u[i];
}
__global__ void tk_gated_backward(const float* g, const float* u, const float* gy, float* gg, float* gu, int64_t n,
                                  bool gelu) {
  TRAIN_FOR_EACH(i, n) {
    float da = 0.f;
    const float a = tk_act(g[i], gelu, &da);
    if (gg) gg[i] += gy[i] * u[i] * da;
    if (gu) gu[i] += gy[i] * a;
  }
}

__device__ __forceinline__ float tk_gain(const float* w, int64_t i, bool plus_one) {
  return w ? (plus_one ? 1.0f + w[i] : w[i]) : 1.0f;
}

__global__ void tk_rms_norm(const float* x, const float* w, bool plus_one, float eps, int64_t group, float* y,
                            float* inv) {
  const float* xr = x + blockIdx.x * group;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < group; i += blockDim.x) ss += xr[i] * xr[i];
  ss = train_block_sum(ss);
  const float iv = 1.0f / sqrtf(ss / static_cast<float>(group) + eps);
  if (threadIdx.x == 0) inv[blockIdx.x] = iv;
  float* yr = y + blockIdx.x * group;
  for (int64_t i = threadIdx.x; i < group; i += blockDim.x) yr[i] = xr[i] * iv * tk_gain(w, i, plus_one);
}

// y = x · iv · w with iv = (mean(x²) + eps)^-1/2: dx = iv · gy · w - x · iv³ / n · Σ gy · w · x.
__global__ void tk_rms_norm_backward(const float* x, const float* w, bool plus_one, const float* inv, const float* gy,
                                     int64_t group, float* gx) {
  const int64_t base = blockIdx.x * group;
  float dot = 0.f;
  for (int64_t i = threadIdx.x; i < group; i += blockDim.x) dot += gy[base + i] * tk_gain(w, i, plus_one) * x[base + i];
  dot = train_block_sum(dot);
  const float iv = inv[blockIdx.x];
  const float c = iv * iv * iv * dot / static_cast<float>(group);
  for (int64_t i = threadIdx.x; i < group; i += blockDim.x)
    gx[base + i] += iv * gy[base + i] * tk_gain(w, i, plus_one) - x[base + i] * c;
}

// One thread per element of [T, H, D].
__global__ void tk_rope(const float* x, const float* cs, int64_t T, int64_t H, int64_t D, int64_t half, float* y) {
  TRAIN_FOR_EACH(e, T * H * D) {
    const int64_t i = e % D, t = e / (H * D);
    const float* c = cs + t * half * 2;
    if (i < half) {
      y[e] = x[e] * c[2 * i] - x[e + half] * c[2 * i + 1];
    } else if (i < 2 * half) {
      const int64_t p = i - half;
      y[e] = x[e] * c[2 * p] + x[e - half] * c[2 * p + 1];
    } else {
      y[e] = x[e];
    }
  }
}
__global__ void tk_rope_backward(const float* gy, const float* cs, int64_t T, int64_t H, int64_t D, int64_t half,
                                 float* gx) {
  TRAIN_FOR_EACH(e, T * H * D) {
    const int64_t i = e % D, t = e / (H * D);
    const float* c = cs + t * half * 2;
    if (i < half) {  // the transpose of the rotation
      gx[e] += gy[e] * c[2 * i] + gy[e + half] * c[2 * i + 1];
    } else if (i < 2 * half) {
      const int64_t p = i - half;
      gx[e] += gy[e] * c[2 * p] - gy[e - half] * c[2 * p + 1];
    } else {
      gx[e] += gy[e];
    }
  }
}

}  // namespace

void fill(float* x, int64_t n, float v) {
  if (n <= 0) return;
  tk_fill<<<train_blocks(n), kTrainThreads, 0, stream()>>>(x, n, v);
  check_launch("train fill");
}
void add(const float* a, const float* b, float* y, int64_t n) {
  if (n <= 0) return;
  tk_add<<<train_blocks(n), kTrainThreads, 0, stream()>>>(a, b, y, n);
  check_launch("train add");
}
void axpy(float* y, const float* x, int64_t n, float alpha) {
  if (n <= 0) return;
  tk_axpy<<<train_blocks(n), kTrainThreads, 0, stream()>>>(y, x, n, alpha);
  check_launch("train axpy");
}
void scale(const float* x, float* y, int64_t n, float s) {
  if (n <= 0) return;
  tk_scale<<<train_blocks(n), kTrainThreads, 0, stream()>>>(x, y, n, s);
  check_launch("train scale");
}
void mul(const float* x, const float* m, float* y, int64_t n) {
  if (n <= 0) return;
  tk_mul<<<train_blocks(n), kTrainThreads, 0, stream()>>>(x, m, y, n);
  check_launch("train mul");
}
void mul_add(float* g, const float* gy, const float* m, int64_t n) {
  if (n <= 0) return;
  tk_mul_add<<<train_blocks(n), kTrainThreads, 0, stream()>>>(g, gy, m, n);
  check_launch("train mul_add");
}
void gated(const float* g, const float* u, float* y, int64_t n, bool gelu) {
  if (n <= 0) return;
  tk_gated<<<train_blocks(n), kTrainThreads, 0, stream()>>>(g, u, y, n, gelu);
  check_launch("train gated");
}
void gated_backward(const float* g, const float* u, const float* gy, float* gg, float* gu, int64_t n, bool gelu) {
  if (n <= 0) return;
  tk_gated_backward<<<train_blocks(n), kTrainThreads, 0, stream()>>>(g, u, gy, gg, gu, n, gelu);
  check_launch("train gated_backward");
}

void rms_norm(const float* x, const float* w, bool plus_one, float eps, int64_t groups, int64_t group, float* y,
              float* inv) {
  if (groups <= 0) return;
  const int threads = group >= 1024 ? 256 : 128;
  tk_rms_norm<<<static_cast<unsigned>(groups), threads, 0, stream()>>>(x, w, plus_one, eps, group, y, inv);
  check_launch("train rms_norm");
}
void rms_norm_backward(const float* x, const float* w, bool plus_one, const float* inv, const float* gy, int64_t groups,
                       int64_t group, float* gx) {
  if (groups <= 0) return;
  const int threads = group >= 1024 ? 256 : 128;
  tk_rms_norm_backward<<<static_cast<unsigned>(groups), threads, 0, stream()>>>(x, w, plus_one, inv, gy, group, gx);
  check_launch("train rms_norm_backward");
}

void rope(const float* x, const float* cs, int64_t T, int64_t H, int64_t D, int64_t half, float* y) {
  if (T * H * D <= 0) return;
  tk_rope<<<train_blocks(T * H * D), kTrainThreads, 0, stream()>>>(x, cs, T, H, D, half, y);
  check_launch("train rope");
}
void rope_backward(const float* gy, const float* cs, int64_t T, int64_t H, int64_t D, int64_t half, float* gx) {
  if (T * H * D <= 0) return;
  tk_rope_backward<<<train_blocks(T * H * D), kTrainThreads, 0, stream()>>>(gy, cs, T, H, D, half, gx);
  check_launch("train rope_backward");
}

}  // namespace lathe::cuda::train
