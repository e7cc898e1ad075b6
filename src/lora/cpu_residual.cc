#include "lora/cpu_residual.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>

#include "common/env.h"
#include "common/error.h"
#include "tensor/cpu/simd.h"
#include "tensor/dtype.h"
#include "tensor/thread_pool.h"

namespace lathe::lora {
namespace {

constexpr int64_t kColumnBlock = 32;  // columns per register tile; thread chunks start on multiples of it
// Up to this many multiply-adds of x·Aᵀ, every thread of a call computes all of
// them itself (one pool region per call); above it (prefill, large batches) the
// dots are split first, then the columns (two regions).
std::atomic<int64_t> g_redundant_dot_macs{int64_t{1} << 20};

float dot_bf16(const uint16_t* a, const float* x, int64_t n) {
  int64_t i = 0;
  float s = 0.0f;
#ifdef LATHE_AVX2
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(cpu::load_bf16x8(a + i), _mm256_loadu_ps(x + i), s0);
    s1 = _mm256_fmadd_ps(cpu::load_bf16x8(a + i + 8), _mm256_loadu_ps(x + i + 8), s1);
    s2 = _mm256_fmadd_ps(cpu::load_bf16x8(a + i + 16), _mm256_loadu_ps(x + i + 16), s2);
    s3 = _mm256_fmadd_ps(cpu::load_bf16x8(a + i + 24), _mm256_loadu_ps(x + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(cpu::load_bf16x8(a + i), _mm256_loadu_ps(x + i), s0);
  s = cpu::hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
#endif
  for (; i < n; ++i) s = std::fma(bf16_to_f32(a[i]), x[i], s);
  return s;
}

// y[o0, o1) += Σ_f Σ_k u[f, k] · Bᵀ_f[k, o0..o1), u holding every factor's rank
// entries in order (scales folded in). The sum stays in registers; y is read
// and written once.
void add_columns(const std::vector<const CpuFactor*>& fs, const float* u, float* y, int64_t o0, int64_t o1) {
  int64_t o = o0;
#ifdef LATHE_AVX2
  for (; o + kColumnBlock <= o1; o += kColumnBlock) {
    __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps(), c2 = _mm256_setzero_ps(), c3 = _mm256_setzero_ps();
    const float* uf = u;
    for (const CpuFactor* f : fs) {
      const uint16_t* b = f->bt.data() + o;
      for (int64_t k = 0; k < f->rank; ++k, b += f->out) {
        const __m256 s = _mm256_set1_ps(uf[k]);
        c0 = _mm256_fmadd_ps(s, cpu::load_bf16x8(b), c0);
        c1 = _mm256_fmadd_ps(s, cpu::load_bf16x8(b + 8), c1);
        c2 = _mm256_fmadd_ps(s, cpu::load_bf16x8(b + 16), c2);
        c3 = _mm256_fmadd_ps(s, cpu::load_bf16x8(b + 24), c3);
      }
      uf += f->rank;
    }
    _mm256_storeu_ps(y + o, _mm256_add_ps(_mm256_loadu_ps(y + o), c0));
    _mm256_storeu_ps(y + o + 8, _mm256_add_ps(_mm256_loadu_ps(y + o + 8), c1));
    _mm256_storeu_ps(y + o + 16, _mm256_add_ps(_mm256_loadu_ps(y + o + 16), c2));
    _mm256_storeu_ps(y + o + 24, _mm256_add_ps(_mm256_loadu_ps(y + o + 24), c3));
  }
#endif
  for (; o < o1; ++o) {
    float c = 0.0f;
    const float* uf = u;
    for (const CpuFactor* f : fs) {
      for (int64_t k = 0; k < f->rank; ++k)
        c = std::fma(uf[k], bf16_to_f32(f->bt[static_cast<size_t>(k * f->out + o)]), c);
      uf += f->rank;
    }
    y[o] += c;
  }
}

int64_t rank_sum(const std::vector<const CpuFactor*>& fs) {
  int64_t r = 0;
  for (const CpuFactor* f : fs) r += f->rank;
  return r;
}

}  // namespace

namespace {
std::atomic<int64_t> g_inline_macs{-1};
}  // namespace

int64_t cpu_residual_inline_macs() {
  int64_t v = g_inline_macs.load(std::memory_order_relaxed);
  if (v < 0) {
    v = std::max<int64_t>(0, env_int("LATHE_LORA_INLINE_MACS", int64_t{1} << 14));
    if (const int64_t r = env_int("LATHE_LORA_SHARED_DOT_MACS", -1); r >= 0)
      g_redundant_dot_macs.store(r, std::memory_order_relaxed);
    g_inline_macs.store(v, std::memory_order_relaxed);
  }
  return v;
}

void set_cpu_residual_split(int64_t inline_macs, int64_t redundant_dot_macs) {
  g_inline_macs.store(inline_macs, std::memory_order_relaxed);
  g_redundant_dot_macs.store(redundant_dot_macs, std::memory_order_relaxed);
}

CpuFactor make_cpu_factor(const Tensor& a, const Tensor& b, float scale) {
  LATHE_CHECK(a.ndim() == 2 && b.ndim() == 2 && a.dim(0) == b.dim(1), "lora: factor shapes do not pair");
  CpuFactor f;
  f.rank = a.dim(0);
  f.in = a.dim(1);
  f.out = b.dim(0);
  f.scale = scale;
  const std::vector<float> av = a.to_floats(), bv = b.to_floats();
  f.a.resize(av.size());
  for (size_t i = 0; i < av.size(); ++i) f.a[i] = f32_to_bf16(av[i]);
  f.bt.resize(bv.size());
  for (int64_t o = 0; o < f.out; ++o)
    for (int64_t k = 0; k < f.rank; ++k)
      f.bt[static_cast<size_t>(k * f.out + o)] = f32_to_bf16(bv[static_cast<size_t>(o * f.rank + k)]);
  return f;
}

void add_cpu_residual(const std::vector<CpuRowGroup>& groups, const float* x, int64_t ldx, float* y, int64_t ldy) {
  // u: per group, per row, the stacked factors' x·Aᵀ entries (scaled), one
  // block of rank_sum floats per row.
  struct Dot {
    const uint16_t* a;
    const float* x;
    int64_t u;  // index in u
    float scale;
  };
  int64_t in = 0, out = 0, u_size = 0, dot_macs = 0, macs = 0;
  thread_local std::vector<int64_t> u_off, ranks;
  u_off.assign(groups.size(), 0);
  ranks.assign(groups.size(), 0);
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& fs = *groups[g].factors;
    if (fs.empty() || groups[g].n == 0) continue;
    in = fs[0]->in;
    out = fs[0]->out;
    ranks[g] = rank_sum(fs);
    u_off[g] = u_size;
    u_size += groups[g].n * ranks[g];
    dot_macs += groups[g].n * ranks[g] * in;
    macs += groups[g].n * ranks[g] * (in + out);
  }
  if (u_size == 0) return;
  thread_local std::vector<float> u_buf;
  thread_local std::vector<Dot> dots;
  u_buf.assign(static_cast<size_t>(u_size), 0.0f);
  dots.clear();
  for (size_t g = 0; g < groups.size(); ++g) {
    const CpuRowGroup& G = groups[g];
    if (G.factors->empty()) continue;
    for (int64_t i = 0; i < G.n; ++i) {
      const int64_t t = G.rows ? G.rows[i] : i;
      int64_t u = u_off[g] + i * ranks[g];
      for (const CpuFactor* f : *G.factors) {
        LATHE_CHECK(f->in == in && f->out == out, "lora: factors of one site differ in shape");
        for (int64_t k = 0; k < f->rank; ++k) dots.push_back({f->a.data() + k * in, x + t * ldx, u++, f->scale});
      }
    }
  }
  // Workers see their own thread_locals: the lambdas reach the caller's buffers
  // through these pointers.
  const Dot* dp = dots.data();
  const int64_t n_dots = static_cast<int64_t>(dots.size());
  const int64_t* uo = u_off.data();
  const int64_t* rk = ranks.data();
  const auto run_dots = [dp, in](float* u, int64_t d0, int64_t d1) {
    for (int64_t d = d0; d < d1; ++d) u[dp[d].u] = dp[d].scale * dot_bf16(dp[d].a, dp[d].x, in);
  };
  const auto run_columns = [&](const float* u, int64_t o0, int64_t o1) {
    for (size_t g = 0; g < groups.size(); ++g) {
      const CpuRowGroup& G = groups[g];
      if (G.factors->empty()) continue;
      for (int64_t i = 0; i < G.n; ++i) {
        const int64_t t = G.rows ? G.rows[i] : i;
        add_columns(*G.factors, u + uo[g] + i * rk[g], y + t * ldy, o0, o1);
      }
    }
  };
  if (macs < cpu_residual_inline_macs()) {
    run_dots(u_buf.data(), 0, n_dots);
    run_columns(u_buf.data(), 0, out);
    return;
  }
  if (dot_macs <= g_redundant_dot_macs.load(std::memory_order_relaxed)) {
    // One pool region: every thread that takes a column chunk first computes
    // all of u itself (once per call: the A reads are small and the threads
    // read them at the same time, so mostly once from memory), so the B pass
    // needs no barrier and no second wake-up. The dots are the same code on
    // every thread: a row's result does not depend on which thread ran it.
    static std::atomic<uint64_t> calls{0};
    const uint64_t call = calls.fetch_add(1, std::memory_order_relaxed) + 1;
    parallel_for(out, kColumnBlock, [&, call](int64_t o0, int64_t o1) {
      thread_local uint64_t done = 0;
      thread_local std::vector<float> mine;
      if (done != call) {
        mine.assign(static_cast<size_t>(u_size), 0.0f);
        run_dots(mine.data(), 0, n_dots);
        done = call;
      }
      run_columns(mine.data(), o0, o1);
    });
    return;
  }
  float* ub = u_buf.data();
  parallel_for(n_dots, std::max<int64_t>(1, 4096 / std::max<int64_t>(in, 1)),
               [&](int64_t d0, int64_t d1) { run_dots(ub, d0, d1); });
  parallel_for(out, kColumnBlock, [&](int64_t o0, int64_t o1) { run_columns(ub, o0, o1); });
}

}  // namespace lathe::lora
