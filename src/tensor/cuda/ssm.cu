// Gated DeltaNet kernels: the depthwise causal conv1d with its carried window, the decay/step-size gates, the
// delta-rule recurrence, the L2 and gated RMS norms around it, and the sigmoid output gate of gated attention.
// The recurrence is serial in time but independent per state row S[h, i, :], so one warp owns one row in
// registers for the whole sequence and the state is read and written once per call.
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels_models.h"

namespace lathe::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxConv = 8;      // conv kernel width
constexpr int kMaxKPerLane = 8;  // Dk ≤ 256

template <class T>
__global__ void sigmoid_mul_kernel(const T* __restrict__ x, const T* __restrict__ g, T* __restrict__ o, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) o[i] = from_f<T>(to_f(x[i]) / (1.0f + expf(-to_f(g[i]))));
}

// One warp per row.
template <class T>
__global__ void l2_norm_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t D, float eps) {
  const T* xr = x + blockIdx.x * D;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < D; i += 32) ss += to_f(xr[i]) * to_f(xr[i]);
  const float inv = 1.0f / sqrtf(warp_sum(ss) + eps);
  for (int64_t i = threadIdx.x; i < D; i += 32) out[blockIdx.x * D + i] = from_f<T>(to_f(xr[i]) * inv);
}

template <class TX, class TZ, class TO>
__global__ void rms_gated_kernel(const TX* __restrict__ x, const TZ* __restrict__ z, const float* __restrict__ w,
                                 TO* __restrict__ out, int64_t D, float eps) {
  const int64_t r = blockIdx.x;
  const TX* xr = x + r * D;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < D; i += 32) ss += to_f(xr[i]) * to_f(xr[i]);
  const float inv = 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(D) + eps);
  for (int64_t i = threadIdx.x; i < D; i += 32) {
    const float zv = to_f(z[r * D + i]);
    out[r * D + i] = from_f<TO>(w[i] * (to_f(xr[i]) * inv) * (zv / (1.0f + expf(-zv))));
  }
}

// One thread per channel walks all T steps with its window in registers.
template <class T>
__global__ void conv1d_kernel(const T* __restrict__ x, const float* __restrict__ w, float* __restrict__ state,
                              float* __restrict__ out, int64_t T_, int64_t C, int K) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float win[kMaxConv], wc[kMaxConv];
#pragma unroll
  for (int j = 0; j < kMaxConv; ++j) {
    wc[j] = j < K ? w[c * K + j] : 0.f;
    win[j] = j < K - 1 ? state[j * C + c] : 0.f;
  }
  for (int64_t t = 0; t < T_; ++t) {
    win[K - 1] = to_f(x[t * C + c]);
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < kMaxConv; ++j)
      if (j < K) acc += wc[j] * win[j];
    out[t * C + c] = acc / (1.0f + expf(-acc));
#pragma unroll
    for (int j = 0; j + 1 < kMaxConv; ++j)
      if (j + 1 < K) win[j] = win[j + 1];
  }
#pragma unroll
  for (int j = 0; j < kMaxConv; ++j)
    if (j < K - 1) state[j * C + c] = win[j];
}

template <class T>
__global__ void gates_kernel(const T* __restrict__ a, const T* __restrict__ b, const float* __restrict__ neg_a,
                             const float* __restrict__ dt_bias, float* __restrict__ g, float* __restrict__ beta,
                             int64_t n, int64_t H) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const int64_t h = i % H;
  const float u = to_f(a[i]) + dt_bias[h];
  const float softplus = u > 20.f ? u : log1pf(expf(u));
  g[i] = neg_a[h] * softplus;
  beta[i] = 1.0f / (1.0f + expf(-to_f(b[i])));
}

// Warp (h, i) owns state row S[h, i, :]: lane l holds columns l, l + 32, ...
__global__ void delta_rule_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                                  const float* __restrict__ g, const float* __restrict__ beta, float* __restrict__ S,
                                  float* __restrict__ out, int64_t T_, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  if (row >= Hv * Dv) return;
  const int lane = threadIdx.x & 31;
  const int64_t h = row / Dv, i = row % Dv, kh = h / (Hv / Hk);
  float* Sr = S + row * Dk;
  float s[kMaxKPerLane];
#pragma unroll
  for (int r = 0; r < kMaxKPerLane; ++r) {
    const int64_t j = lane + 32 * r;
    s[r] = j < Dk ? Sr[j] : 0.f;
  }
  for (int64_t t = 0; t < T_; ++t) {
    const float decay = expf(g[t * Hv + h]), b = beta[t * Hv + h];
    const float* kt = k + (t * Hk + kh) * Dk;
    const float* qt = q + (t * Hk + kh) * Dk;
    float kv[kMaxKPerLane], ks = 0.f;
#pragma unroll
    for (int r = 0; r < kMaxKPerLane; ++r) {
      const int64_t j = lane + 32 * r;
      kv[r] = j < Dk ? kt[j] : 0.f;
      s[r] *= decay;
      ks += s[r] * kv[r];
    }
    const float delta = (v[(t * Hv + h) * Dv + i] - warp_sum(ks)) * b;
    float y = 0.f;
#pragma unroll
    for (int r = 0; r < kMaxKPerLane; ++r) {
      const int64_t j = lane + 32 * r;
      s[r] += delta * kv[r];
      y += s[r] * (j < Dk ? qt[j] : 0.f);
    }
    y = warp_sum(y);
    if (lane == 0) out[(t * Hv + h) * Dv + i] = y;
  }
#pragma unroll
  for (int r = 0; r < kMaxKPerLane; ++r) {
    const int64_t j = lane + 32 * r;
    if (j < Dk) Sr[j] = s[r];
  }
}

}  // namespace

void sigmoid_mul(const void* x, const void* gate, void* out, DType t, int64_t n) {
  if (n == 0) return;
  LATHE_DISPATCH_ACT(t, "sigmoid_mul", T,
                     sigmoid_mul_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, stream()>>>(
                         static_cast<const T*>(x), static_cast<const T*>(gate), static_cast<T*>(out), n));
  check_launch("sigmoid_mul");
}

void l2_normalize(const void* x, DType t, void* out, int64_t rows, int64_t D, float eps) {
  if (rows == 0) return;
  LATHE_DISPATCH_ACT(t, "l2_normalize", T,
                     l2_norm_kernel<T><<<static_cast<unsigned>(rows), 32, 0, stream()>>>(static_cast<const T*>(x),
                                                                                         static_cast<T*>(out), D, eps));
  check_launch("l2_normalize");
}

void rms_norm_gated(const void* x, DType xt, const void* z, DType zt, const float* w, void* out, DType ot, int64_t rows,
                    int64_t D, float eps) {
  if (rows == 0) return;
  LATHE_DISPATCH_ACT(xt, "rms_norm_gated", TX, {
    LATHE_DISPATCH_ACT(zt, "rms_norm_gated", TZ, {
      LATHE_DISPATCH_ACT(ot, "rms_norm_gated", TO,
                         rms_gated_kernel<TX, TZ, TO><<<static_cast<unsigned>(rows), 32, 0, stream()>>>(
                             static_cast<const TX*>(x), static_cast<const TZ*>(z), w, static_cast<TO*>(out), D, eps));
    });
  });
  check_launch("rms_norm_gated");
}

void causal_conv1d_silu(const void* x, DType xt, const float* w, float* state, float* out, int64_t T_, int64_t C,
                        int K) {
  if (K < 1 || K > kMaxConv) throw Error(ErrorKind::Unsupported, "causal_conv1d: kernel width above 8 on CUDA");
  if (C == 0) return;
  LATHE_DISPATCH_ACT(xt, "causal_conv1d", T,
                     conv1d_kernel<T>
                     <<<blocks_for(C, 128), 128, 0, stream()>>>(static_cast<const T*>(x), w, state, out, T_, C, K));
  check_launch("causal_conv1d");
}

void gated_delta_rule(const float* q, const float* k, const float* v, const float* g, const float* beta, float* state,
                      float* out, int64_t T_, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv) {
  if (Dk > 32 * kMaxKPerLane) throw Error(ErrorKind::Unsupported, "gated_delta_rule: key head above 256 on CUDA");
  const int64_t rows = Hv * Dv;
  if (rows == 0) return;
  constexpr int kWarps = 4;
  delta_rule_kernel<<<blocks_for(rows, kWarps), kWarps * 32, 0, stream()>>>(q, k, v, g, beta, state, out, T_, Hk, Hv,
                                                                            Dk, Dv);
  check_launch("gated_delta_rule");
}

void delta_gates(const void* a, const void* b, DType t, const float* neg_a, const float* dt_bias, float* g, float* beta,
                 int64_t T_, int64_t H) {
  const int64_t n = T_ * H;
  if (n == 0) return;
  LATHE_DISPATCH_ACT(t, "delta_gates", T,
                     gates_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, stream()>>>(
                         static_cast<const T*>(a), static_cast<const T*>(b), neg_a, dt_bias, g, beta, n, H));
  check_launch("delta_gates");
}

}  // namespace lathe::cuda
