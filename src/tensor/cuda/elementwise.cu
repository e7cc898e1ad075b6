// Row-wise and elementwise kernels: RMSNorm, RoPE, gated activations, add/scale/softcap, conversion, bias
// (argmax is in argmax.cu). f32 arithmetic whatever the element type.
#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <cstring>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels.h"

namespace lathe::cuda {
namespace {

constexpr int kThreads = 256;

// One block per row; each thread keeps its kPer values in registers (all loads issued first: a decode row is
// one latency-bound block).
template <class T, class TO, int kPer>
__global__ void rms_norm_kernel(const T* __restrict__ x, TO* __restrict__ out, int64_t D, const float* __restrict__ w,
                                float eps, bool plus_one) {
  pdl_trigger();  // a decode GEMV usually follows: let it start fetching its weights
  const int64_t row = blockIdx.x;
  const T* xr = x + row * D;
  TO* orow = out + row * D;
  float v[kPer], gv[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t i = threadIdx.x + k * blockDim.x;
    v[k] = i < D ? to_f(xr[i]) : 0.f;
    gv[k] = i < D ? norm_gain(w, i, plus_one) : 1.0f;  // loaded before the reduction, not after
  }
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kPer; ++k) ss += v[k] * v[k];
  const float inv = 1.0f / sqrtf(block_sum(ss) / static_cast<float>(D) + eps);
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t i = threadIdx.x + k * blockDim.x;
    if (i < D) orow[i] = from_f<TO>(w ? gv[k] * (v[k] * inv) : v[k] * inv);
  }
}

struct RopeFreqs {
  float inv_freq[256];
};

template <class T>
__global__ void rope_kernel(T* x, int64_t H, int64_t D, int half, const RopeFreqs f, float scaling, int64_t pos0,
                            const int64_t* __restrict__ delta) {
  const int64_t th = blockIdx.x;  // t * H + h
  const int64_t t = th / H;
  T* v = x + th * D;
  const float pos = static_cast<float>(pos0 + t + *delta);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float s, c;
    sincosf(pos * f.inv_freq[i], &s, &c);
    c *= scaling;
    s *= scaling;
    const float a = to_f(v[i]), b = to_f(v[i + half]);
    v[i] = from_f<T>(a * c - b * s);
    v[i + half] = from_f<T>(b * c + a * s);
  }
}

template <bool kGelu>
__device__ __forceinline__ float gate_act(float x) {
  if constexpr (kGelu) {
    constexpr float kSqrt2OverPi = 0.7978845608028654f;
    return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
  } else {
    return x / (1.0f + expf(-x));
  }
}

// Row r of gate and up at g + r·stride and u + r·stride (contiguous tensors: one row of all n elements; the halves
// of a fused gate|up output: its rows); out contiguous.
template <class T, bool kGelu>
__global__ void gated_rows_kernel(const T* __restrict__ g, const T* __restrict__ u, T* __restrict__ o, int64_t width,
                                  int64_t stride) {
  pdl_trigger();  // the down projection's GEMV follows
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x, r = blockIdx.y;
  if (c >= width) return;
  o[r * width + c] = from_f<T>(gate_act<kGelu>(to_f(g[r * stride + c])) * to_f(u[r * stride + c]));
}

// gated_rows_kernel with 16 bytes of each row a thread (loads and stores), where widths, strides and rows allow:
// one value a thread ran a 64-prompt prefill's [8192, 9728] at ~35% of the copy rate. Same arithmetic per value.
template <class T, bool kGelu>
__global__ void gated_rows_vec_kernel(const T* __restrict__ g, const T* __restrict__ u, T* __restrict__ o,
                                      int64_t width, int64_t stride) {
  pdl_trigger();
  constexpr int kVec = 16 / sizeof(T);
  const int64_t c = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * kVec, r = blockIdx.y;
  if (c >= width) return;
  const uint4 gv = *reinterpret_cast<const uint4*>(g + r * stride + c);
  const uint4 uv = *reinterpret_cast<const uint4*>(u + r * stride + c);
  uint4 ov;
  const T* gp = reinterpret_cast<const T*>(&gv);
  const T* up = reinterpret_cast<const T*>(&uv);
  T* op = reinterpret_cast<T*>(&ov);
#pragma unroll
  for (int k = 0; k < kVec; ++k) op[k] = from_f<T>(gate_act<kGelu>(to_f(gp[k])) * to_f(up[k]));
  *reinterpret_cast<uint4*>(o + r * width + c) = ov;
}

template <class TA, class TB>
__global__ void add_kernel(TA* a, const TB* __restrict__ b, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) a[i] = from_f<TA>(to_f(a[i]) + to_f(b[i]));
}

template <class T>
__global__ void scale_kernel(T* x, int64_t n, float s) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] = from_f<T>(to_f(x[i]) * s);
}

template <class T>
__global__ void softcap_kernel(T* x, int64_t n, float cap) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] = from_f<T>(tanhf(to_f(x[i]) / cap) * cap);
}

template <class TI, class TO>
__global__ void convert_kernel(const TI* __restrict__ in, TO* __restrict__ out, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = from_f<TO>(to_f(in[i]));
}

template <class T>
__global__ void bias_kernel(T* y, int64_t N, int64_t total, const float* __restrict__ bias) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < total) y[i] = from_f<T>(to_f(y[i]) + bias[i % N]);
}

// One block per segment, 4-byte words (segment sizes and addresses are multiples of 4).
__global__ void copy_segments_kernel(const CopySegment* __restrict__ segs) {
  const CopySegment s = segs[blockIdx.x];
  const auto* src = static_cast<const uint32_t*>(s.src);
  auto* dst = static_cast<uint32_t*>(s.dst);
  for (int64_t i = threadIdx.x; i < s.bytes / 4; i += blockDim.x) dst[i] = src[i];
}

__global__ void copy_rows_kernel(uint32_t* dst, int64_t dst_row, const uint32_t* __restrict__ src, int64_t words,
                                 int64_t row_words, const int64_t* __restrict__ delta) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < words) dst[(dst_row + *delta) * row_words + i] = src[i];
}

}  // namespace

void rms_norm(const void* x, DType xt, void* out, DType ot, int64_t rows, int64_t dim, const float* w, float eps,
              bool plus_one) {
  if (rows == 0) return;
  const NormRowLaunch l = norm_row_launch(dim, "rms_norm");
  LATHE_DISPATCH_ACT(xt, "rms_norm", T, {
    LATHE_DISPATCH_ACT(ot, "rms_norm", TO, {
      auto* kernel = l.wide ? rms_norm_kernel<T, TO, 32> : rms_norm_kernel<T, TO, 8>;
      kernel<<<static_cast<unsigned>(rows), l.threads, 0, stream()>>>(static_cast<const T*>(x), static_cast<TO*>(out),
                                                                      dim, w, eps, plus_one);
    });
  });
  check_launch("rms_norm");
}

void rope(void* x, DType t, int64_t T_, int64_t H, int64_t D, const float* inv_freq, int dims, float scaling,
          int64_t pos0) {
  const int half = dims / 2;
  if (T_ * H == 0 || half == 0) return;
  if (half > 256) throw Error(ErrorKind::Unsupported, "rope: more than 512 rotary dims on CUDA");
  RopeFreqs f{};
  std::memcpy(f.inv_freq, inv_freq, sizeof(float) * static_cast<size_t>(half));
  const int threads = half >= 64 ? 64 : 32;
  LATHE_DISPATCH_ACT(t, "rope", T,
                     rope_kernel<T><<<static_cast<unsigned>(T_ * H), threads, 0, stream()>>>(
                         static_cast<T*>(x), H, D, half, f, scaling, pos0, step_delta()));
  check_launch("rope");
}

void gated(const void* gate, const void* up, void* out, DType t, int64_t n, Gate g) {
  gated_rows(gate, up, out, t, 1, n, n, g);
}

void gated_rows(const void* gate, const void* up, void* out, DType t, int64_t rows, int64_t width, int64_t stride,
                Gate g) {
  if (rows == 0 || width == 0) return;
  const dim3 grid(static_cast<unsigned>((width + kThreads - 1) / kThreads), static_cast<unsigned>(rows));
  LATHE_DISPATCH_ACT(t, "gated activation", T, {
    constexpr int64_t kVec = 16 / sizeof(T);
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    if (width % kVec == 0 && stride % kVec == 0 && aligned(gate) && aligned(up) && aligned(out)) {
      const dim3 vgrid(static_cast<unsigned>((width / kVec + kThreads - 1) / kThreads), static_cast<unsigned>(rows));
      if (g == Gate::SiLU)
        gated_rows_vec_kernel<T, false><<<vgrid, kThreads, 0, stream()>>>(
            static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(out), width, stride);
      else
        gated_rows_vec_kernel<T, true><<<vgrid, kThreads, 0, stream()>>>(
            static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(out), width, stride);
    } else if (g == Gate::SiLU)
      gated_rows_kernel<T, false><<<grid, kThreads, 0, stream()>>>(
          static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(out), width, stride);
    else
      gated_rows_kernel<T, true><<<grid, kThreads, 0, stream()>>>(
          static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(out), width, stride);
  });
  check_launch("gated_rows");
}

void add_inplace(void* a, DType at, const void* b, DType bt, int64_t n) {
  if (n == 0) return;
  LATHE_DISPATCH_ACT(at, "add", TA, {
    LATHE_DISPATCH_ACT(bt, "add", TB,
                       add_kernel<TA, TB><<<blocks_for(n, kThreads), kThreads, 0, stream()>>>(
                           static_cast<TA*>(a), static_cast<const TB*>(b), n));
  });
  check_launch("add");
}

void scale_inplace(void* x, DType t, int64_t n, float s) {
  if (n == 0) return;
  LATHE_DISPATCH_ACT(t, "scale", T,
                     scale_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, stream()>>>(static_cast<T*>(x), n, s));
  check_launch("scale");
}

void softcap_inplace(void* x, DType t, int64_t n, float cap) {
  if (n == 0) return;
  LATHE_DISPATCH_ACT(t, "softcap", T,
                     softcap_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, stream()>>>(static_cast<T*>(x), n, cap));
  check_launch("softcap");
}

void convert(const void* in, DType it, void* out, DType ot, int64_t n) {
  if (n == 0) return;
  LATHE_DISPATCH_ACT(it, "convert", TI, {
    LATHE_DISPATCH_ACT(ot, "convert", TO,
                       convert_kernel<TI, TO><<<blocks_for(n, kThreads), kThreads, 0, stream()>>>(
                           static_cast<const TI*>(in), static_cast<TO*>(out), n));
  });
  check_launch("convert");
}

void add_bias(void* y, DType t, int64_t M, int64_t N, const float* bias) {
  const int64_t total = M * N;
  if (total == 0) return;
  LATHE_DISPATCH_ACT(t, "bias", T,
                     bias_kernel<T>
                     <<<blocks_for(total, kThreads), kThreads, 0, stream()>>>(static_cast<T*>(y), N, total, bias));
  check_launch("add_bias");
}

void copy_segments(const CopySegment* segs, int64_t n) {
  if (n == 0) return;
  copy_segments_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream()>>>(segs);
  check_launch("copy_segments");
}

void copy_rows(void* dst, int64_t dst_row, const void* src, int64_t n, size_t row_bytes) {
  const int64_t words = n * static_cast<int64_t>(row_bytes / 4);
  if (words == 0) return;
  copy_rows_kernel<<<blocks_for(words, kThreads), kThreads, 0, stream()>>>(
      static_cast<uint32_t*>(dst), dst_row, static_cast<const uint32_t*>(src), words,
      static_cast<int64_t>(row_bytes / 4), step_delta());
  check_launch("copy_rows");
}

}  // namespace lathe::cuda
