// Sampling on the device (the device sampler's temperature rows, and greedy rows that want their token's
// logprob): one block per row repeats the host Sampler's steps over that row — log-softmax, then top-p → min-p →
// top-k on the log-probabilities, then a categorical over softmax(f / T) by inverse CDF with the row's own draw —
// and only the id and its logprob come back.
//
// Where the host adds doubles in sorted or index order, the block adds fixed-point integers: exact in any order,
// so a row's token is the same in every launch whatever else is in the batch, and it is the host's token except
// where the two sums fall on opposite sides of a boundary (a relative margin ~1e-15). The host's sort (top-p's
// walk from the most likely token down, top-k's first k) becomes a selection of the element where the walk
// reaches a mass or a count: a histogram over bins of 1/64 nat, then 11-bit digits of the float keys inside the
// chosen bin, then the rank by index among equal values (the stable sort's order for ties).
#include <cmath>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels.h"

namespace lathe::cuda {
namespace {

using u64 = unsigned long long;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;  // 32: a warp-sized second reduction level
constexpr int kBins = 2048;
constexpr float kBinsPerNat = 64.0f;

struct SampleShared {
  u64 hist[kBins];
  u64 u64s[kWarps];
  double doubles[kWarps];
  float floats[kWarps];
  int ints[kWarps];
  int found_bin;
  u64 found_before;
  int cut_index;
};

__device__ __forceinline__ float clean(float v) { return isnan(v) ? -INFINITY : v; }

// The host's stable descending order as ascending keys (ties are then ordered by index); -0 ranks as +0.
__device__ __forceinline__ uint32_t desc_key(float v) {
  if (v == 0.0f) v = 0.0f;
  const uint32_t u = __float_as_uint(v);
  return ~((u & 0x80000000u) ? ~u : (u | 0x80000000u));
}

// Bins of 1/64 nat below 0, the last one open: never decreasing along desc_key, so a bin is a key range.
__device__ __forceinline__ int coarse_bin(float lp) {
  if (!(lp < 0.0f)) return 0;
  const float b = -lp * kBinsPerNat;
  return b >= static_cast<float>(kBins - 1) ? kBins - 1 : static_cast<int>(b);
}

// The warp's largest value and its first index (index < 0: none), in every lane.
__device__ __forceinline__ void warp_max_first(float& best, int& best_i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (oi >= 0 && (best_i < 0 || ov > best || (ov == best && oi < best_i))) {
      best = ov;
      best_i = oi;
    }
  }
}

// Every thread gets op over all threads' v, combined in a fixed tree (the same result each launch).
template <class T, class Op>
__device__ T block_all(T v, Op op, T* sh) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // sh may still be read by the previous call
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  v = sh[threadIdx.x & 31];
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The bin where a running total over hist[0..kBins) first reaches r (before < r ≤ before + hist[bin]), or -1
// when the whole total is below r. Two bins a thread.
__device__ int find_bin(SampleShared& s, u64 r, u64& before) {
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const u64 a = s.hist[2 * t], b = s.hist[2 * t + 1];
  u64 x = a + b;
  for (int o = 1; o < 32; o <<= 1) {
    const u64 y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();
  if (lane == 31) s.u64s[warp] = x;
  if (t == 0) s.found_bin = -1;
  __syncthreads();
  u64 excl = x - (a + b);
  for (int k = 0; k < warp; ++k) excl += s.u64s[k];
  if (excl < r && r <= excl + a) {
    s.found_bin = 2 * t;
    s.found_before = excl;
  } else if (excl + a < r && r <= excl + a + b) {
    s.found_bin = 2 * t + 1;
    s.found_before = excl + a;
  }
  __syncthreads();
  before = s.found_before;
  return s.found_bin;
}

struct Cut {
  uint32_t key = 0;
  int index = 0;
  bool found = false;
};

// Walking the row in (desc_key, index) order and adding weight(i, lp) (0: the element is not walked), the element
// where the total first reaches r (≥ 1). Every walked element of one value has one weight (it depends only on
// lp, or is 1), so the rank among equal values is a division.
template <class Weight>
__device__ Cut select_cut(const float* __restrict__ row, int V, float lse, u64 r, Weight weight, SampleShared& s) {
  Cut cut;
  for (int b = threadIdx.x; b < kBins; b += kThreads) s.hist[b] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < V; i += kThreads) {
    const float lp = clean(row[i]) - lse;
    const u64 w = weight(i, lp);
    if (w) atomicAdd(&s.hist[coarse_bin(lp)], w);
  }
  __syncthreads();
  u64 before = 0;
  const int bin = find_bin(s, r, before);
  if (bin < 0) return cut;
  r -= before;
  // The key range of the walked elements in that bin, then its 11-bit digits from the top.
  uint32_t kmin = 0xffffffffu, kmax = 0;
  for (int i = threadIdx.x; i < V; i += kThreads) {
    const float lp = clean(row[i]) - lse;
    if (coarse_bin(lp) == bin && weight(i, lp)) {
      const uint32_t k = desc_key(lp);
      kmin = min(kmin, k);
      kmax = max(kmax, k);
    }
  }
  kmin = block_all(
      kmin, [](uint32_t x, uint32_t y) { return min(x, y); }, reinterpret_cast<uint32_t*>(s.ints));
  kmax = block_all(
      kmax, [](uint32_t x, uint32_t y) { return max(x, y); }, reinterpret_cast<uint32_t*>(s.ints));
  const uint32_t span = kmax - kmin;
  int hi = span ? 32 - __clz(span) : 0;
  uint64_t prefix = 0;  // the digits chosen so far: (key - kmin) >> hi
  while (hi > 0) {
    const int bits = hi < 11 ? hi : 11, shift = hi - bits;
    for (int b = threadIdx.x; b < kBins; b += kThreads) s.hist[b] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < V; i += kThreads) {
      const float lp = clean(row[i]) - lse;
      if (coarse_bin(lp) != bin) continue;
      const u64 w = weight(i, lp);
      const uint64_t d = desc_key(lp) - kmin;
      if (w && (d >> hi) == prefix) atomicAdd(&s.hist[(d >> shift) & ((1u << bits) - 1)], w);
    }
    __syncthreads();
    const int digit = find_bin(s, r, before);
    r -= before;
    prefix = (prefix << bits) | static_cast<uint64_t>(digit);
    hi = shift;
  }
  cut.key = kmin + static_cast<uint32_t>(prefix);
  cut.found = true;
  // The walked elements of that key, in index order: the walk takes the first ceil(r / weight) of them. Each warp
  // counts a contiguous segment, then the warp holding the one wanted finds it.
  u64 one = 0;
  for (int i = threadIdx.x; i < V && !one; i += kThreads) {
    const float lp = clean(row[i]) - lse;
    if (desc_key(lp) == cut.key) one = weight(i, lp);
  }
  one = block_all(
      one, [](u64 x, u64 y) { return x > y ? x : y; }, s.u64s);
  const u64 take = (r + one - 1) / one;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int seg = (V + kWarps - 1) / kWarps, s0 = warp * seg, s1 = min(V, s0 + seg);
  auto tied = [&](int i) {
    if (i >= s1) return false;
    const float lp = clean(row[i]) - lse;
    return desc_key(lp) == cut.key && weight(i, lp) != 0;
  };
  int count = 0;
  for (int base = s0; base < s1; base += 32) count += __popc(__ballot_sync(0xffffffffu, tied(base + lane)));
  __syncthreads();
  if (lane == 0) s.ints[warp] = count;
  if (threadIdx.x == 0) s.cut_index = V - 1;
  __syncthreads();
  u64 seen = 0;
  int holder = -1;
  for (int k = 0; k < kWarps; ++k) {
    if (seen + static_cast<u64>(s.ints[k]) >= take) {
      holder = k;
      break;
    }
    seen += static_cast<u64>(s.ints[k]);
  }
  if (warp == holder) {
    u64 need = take - seen;
    for (int base = s0; base < s1; base += 32) {
      unsigned m = __ballot_sync(0xffffffffu, tied(base + lane));
      const u64 n = static_cast<u64>(__popc(m));
      if (need <= n) {
        for (u64 k = 1; k < need; ++k) m &= m - 1;
        if (lane == 0) s.cut_index = base + __ffs(m) - 1;
        break;
      }
      need -= n;
    }
  }
  __syncthreads();
  cut.index = s.cut_index;
  return cut;
}

__device__ __forceinline__ bool within(const Cut& c, uint32_t key, int i) {
  return !c.found || key < c.key || (key == c.key && i <= c.index);
}

__global__ void __launch_bounds__(kThreads)
    sample_rows_kernel(const float* __restrict__ x, int V, const RowSampling* __restrict__ params, int weight_shift,
                       int32_t* __restrict__ tokens, float* __restrict__ logprobs) {
  __shared__ SampleShared s;
  const float* row = x + static_cast<int64_t>(blockIdx.x) * V;
  const RowSampling p = params[blockIdx.x];
  // The maximum (first index on ties) and the log-sum-exp, as the host's log_softmax forms them.
  float best = -INFINITY;
  int best_i = -1;
  for (int i = threadIdx.x; i < V; i += kThreads) {
    const float v = clean(row[i]);
    if (best_i < 0 || v > best) {
      best = v;
      best_i = i;
    }
  }
  warp_max_first(best, best_i);
  if ((threadIdx.x & 31) == 0) {
    s.floats[threadIdx.x >> 5] = best;
    s.ints[threadIdx.x >> 5] = best_i;
  }
  __syncthreads();
  best = s.floats[threadIdx.x & 31];
  best_i = s.ints[threadIdx.x & 31];
  warp_max_first(best, best_i);
  const float mx = best;
  const int top = best_i < 0 ? 0 : best_i;
  double sum = 0;
  for (int i = threadIdx.x; i < V; i += kThreads) sum += exp(static_cast<double>(clean(row[i]) - mx));
  sum = block_all(
      sum, [](double a, double b) { return a + b; }, s.doubles);
  const float lse = mx + static_cast<float>(log(sum));
  const float lp_max = mx - lse;
  if (p.inv_temperature == 0.0f) {  // greedy
    if (threadIdx.x == 0) {
      tokens[blockIdx.x] = top;
      logprobs[blockIdx.x] = lp_max;
    }
    return;
  }
  // top-p: the walk from the most likely token down, adding probabilities until the mass reaches top_p.
  Cut cut_p;
  if (p.top_p > 0.0f && p.top_p < 1.0f) {
    const u64 target = __double2ull_ru(static_cast<double>(p.top_p) * 0x1p60);
    cut_p = select_cut(
        row, V, lse, target,
        [](int, float lp) -> u64 {
          return lp == -INFINITY ? 0 : __double2ull_rz(exp(static_cast<double>(lp)) * 0x1p60);
        },
        s);
  }
  // min-p: below max + log(min_p) goes (the maximum itself always stays).
  const bool use_min_p = p.min_p > 0.0f;
  const float min_p_floor = lp_max + p.log_min_p;
  auto kept = [&](int i, float lp) {
    return lp != -INFINITY && within(cut_p, desc_key(lp), i) && !(use_min_p && lp < min_p_floor && lp != lp_max);
  };
  // top-k: the first k of what is left, in the same order.
  Cut cut_k;
  if (p.top_k > 0 && p.top_k < V) {
    int left = 0;
    for (int i = threadIdx.x; i < V; i += kThreads) left += kept(i, clean(row[i]) - lse) ? 1 : 0;
    left = block_all(
        left, [](int a, int b) { return a + b; }, s.ints);
    if (left > p.top_k)
      cut_k = select_cut(
          row, V, lse, static_cast<u64>(p.top_k), [&](int i, float lp) -> u64 { return kept(i, lp) ? 1 : 0; }, s);
  }
  // The categorical over softmax(f / T): weights exp((lp - max) / T) in index order, the first whose running
  // total passes u · total. Each warp sums a contiguous segment; the warp holding the draw walks its segment.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int seg = (V + kWarps - 1) / kWarps, s0 = warp * seg, s1 = min(V, s0 + seg);
  const double scale = ldexp(1.0, weight_shift);
  auto weight = [&](int i) -> u64 {
    if (i >= s1) return 0;
    const float lp = clean(row[i]) - lse;
    if (!kept(i, lp) || !within(cut_k, desc_key(lp), i)) return 0;
    return __double2ull_rz(exp(static_cast<double>((lp - lp_max) * p.inv_temperature)) * scale);
  };
  u64 part = 0;
  for (int base = s0; base < s1; base += 32) part += weight(base + lane);
  for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
  __syncthreads();
  if (lane == 0) s.u64s[warp] = part;
  if (threadIdx.x == 0) s.cut_index = top;
  __syncthreads();
  u64 total = 0;
  for (int k = 0; k < kWarps; ++k) total += s.u64s[k];
  if (total > 0) {
    u64 target = __double2ull_rz(p.u * static_cast<double>(total));
    if (target >= total) target = total - 1;
    u64 seen = 0;
    int holder = -1;
    for (int k = 0; k < kWarps; ++k) {
      if (seen + s.u64s[k] > target) {
        holder = k;
        break;
      }
      seen += s.u64s[k];
    }
    if (warp == holder) {
      for (int base = s0; base < s1; base += 32) {
        const u64 w = weight(base + lane);
        u64 incl = w;
        for (int o = 1; o < 32; o <<= 1) {
          const u64 y = __shfl_up_sync(0xffffffffu, incl, o);
          if (lane >= o) incl += y;
        }
        const unsigned past = __ballot_sync(0xffffffffu, seen + incl > target);
        if (past) {
          if (lane == 0) s.cut_index = base + __ffs(past) - 1;
          break;
        }
        seen += __shfl_sync(0xffffffffu, incl, 31);
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int t = s.cut_index;
    tokens[blockIdx.x] = t;
    logprobs[blockIdx.x] = clean(row[t]) - lse;
  }
}

}  // namespace

void sample_rows(const float* x, int64_t rows, int64_t cols, const RowSampling* params, int32_t* tokens,
                 float* logprobs) {
  if (rows <= 0 || cols <= 0) return;
  if (cols >= (int64_t{1} << 30)) throw Error(ErrorKind::Unsupported, "sample_rows: rows of 2^30 values or more");
  // Fixed-point weights of at most 1 each, so that a row's total stays below 2^62.
  int log2_cols = 0;
  while ((int64_t{1} << log2_cols) < cols) ++log2_cols;
  sample_rows_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream()>>>(x, static_cast<int>(cols), params,
                                                                             62 - log2_cols, tokens, logprobs);
  check_launch("sample_rows");
}

}  // namespace lathe::cuda
