// CUDA kernel benchmark: device copy bandwidth, the quantized GEMV's achieved bandwidth next to it (same
// run), and the prefill GEMM over quantized weights (dequantize to bf16 + cuBLAS) against cuBLAS bf16 on
// already-dense weights. Times with CUDA events, medians over repeats; GEMV inputs rotate over enough weight
// copies to miss the L2, and are timed both as 20 stream launches and as the same 20 calls in one CUDA graph.
// --dense-rows: only cuBLAS over dense bf16 weights at decode-batch rows (the dense weight copies' path).
// --q4-rows: gemm_q4 over 4-bit codes at the same rows and shapes, each next to --dense-rows' figure.
// --decode-attention: one decode row's attention (Qwen3-4B heads, bf16 K/V) at several contexts, through the
// split kernel at its default splits and at fixed ones, and through the wide kernel: where a short context's
// time goes (latency of the block chain and the merge, not bytes); then 16-128 rows through the wide kernel
// and the split kernel's batched launch, next to the copy rate.
// Prints one JSON object.
#ifdef LATHE_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "tensor/cuda/decode_attention.h"
#include "tensor/cuda/decode_attention_wide.h"
#include "tensor/cuda/gemm_q4.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/runtime.h"
#include "tensor/device_memory.h"

namespace {
using namespace lathe;

void* dalloc(size_t bytes, uint32_t seed) {
  void* p = device_alloc(bytes);
  std::vector<uint32_t> h(bytes / 4);
  std::mt19937 rng(seed);
  for (auto& x : h) x = rng();
  device_copy(p, h.data(), h.size() * 4, Device::CUDA, Device::CPU);
  return p;
}

// bf16 values in [lo, hi) (for scales, biases, activations: random bits would be NaNs and infinities).
void* dalloc_bf16(size_t n, uint32_t seed, float lo, float hi) {
  std::vector<uint16_t> h(n);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  for (auto& x : h) {
    float f = d(rng);
    uint32_t b;
    std::memcpy(&b, &f, 4);
    x = static_cast<uint16_t>(b >> 16);
  }
  void* p = device_alloc(n * 2);
  device_copy(p, h.data(), n * 2, Device::CUDA, Device::CPU);
  return p;
}

// A random 4/8-bit weight [N, K] on the device: codes from seed, scales and biases from seed + step and
// seed + 2·step (bf16 in ranges a real checkpoint has).
cuda::QuantView random_quant(int64_t N, int64_t K, int bits, int gs, uint32_t seed, uint32_t step) {
  const size_t groups = static_cast<size_t>(N * K / gs);
  cuda::QuantView q;
  q.w = static_cast<const uint32_t*>(dalloc(static_cast<size_t>(N * K * bits / 8), seed));
  q.scales = dalloc_bf16(groups, seed + step, 0.001f, 0.01f);
  q.biases = dalloc_bf16(groups, seed + 2 * step, -0.05f, 0.05f);
  q.bits = bits;
  q.group_size = gs;
  q.rows = N;
  q.cols = K;
  q.w_stride = K * bits / 32;
  q.sb_stride = K / gs;
  return q;
}

void free_quant(const cuda::QuantView& q) {
  device_free(const_cast<uint32_t*>(q.w));
  device_free(const_cast<void*>(q.scales));
  device_free(const_cast<void*>(q.biases));
}

template <class F>
double median_ms(int reps, F&& f) {
  cudaStream_t s = cuda::stream();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) f(i);
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a, s);
    f(i);
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double copy_bandwidth() {
  const size_t bytes = size_t{2} << 30;
  void* a = device_alloc(bytes);
  void* b = device_alloc(bytes);
  cudaMemsetAsync(a, 1, bytes, cuda::stream());
  const double ms = median_ms(10, [&](int) { cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, cuda::stream()); });
  device_free(a);
  device_free(b);
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;  // read + write
}

nlohmann::json gemv(int64_t N, int64_t K, int bits, int gs, double copy_gbs) {
  const int copies = 8;
  const size_t wbytes = static_cast<size_t>(N * K * bits / 8), groups = static_cast<size_t>(N * K / gs);
  std::vector<cuda::QuantView> qs;
  for (int c = 0; c < copies; ++c) qs.push_back(random_quant(N, K, bits, gs, 100 + static_cast<uint32_t>(c), 100));
  void* x = dalloc_bf16(static_cast<size_t>(K), 7, -1.f, 1.f);
  void* y = device_alloc(static_cast<size_t>(N) * 2);
  // Back to back, as in a decode step (a single timed call would mostly measure its launch); the copies
  // (8 × the matrix, more than L2 holds) keep every call reading from DRAM.
  const int calls = 20;
  const double ms = median_ms(20,
                              [&](int i) {
                                for (int c = 0; c < calls; ++c)
                                  cuda::gemv_quantized(qs[static_cast<size_t>((i * calls + c) % copies)], x,
                                                       DType::BF16, y, DType::BF16, nullptr);
                              }) /
                    calls;
  // The same calls captured in one CUDA graph, as the decode step replays them: no CPU launch cost and the
  // shortest gaps between kernels.
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  LATHE_CUDA_CHECK(cudaStreamBeginCapture(cuda::stream(), cudaStreamCaptureModeThreadLocal));
  for (int c = 0; c < calls; ++c)
    cuda::gemv_quantized(qs[static_cast<size_t>(c % copies)], x, DType::BF16, y, DType::BF16, nullptr);
  LATHE_CUDA_CHECK(cudaStreamEndCapture(cuda::stream(), &graph));
  LATHE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double ms_graph = median_ms(20, [&](int) { cudaGraphLaunch(exec, cuda::stream()); }) / calls;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  const double bytes = static_cast<double>(wbytes + groups * 4 + static_cast<size_t>(K + N) * 2);
  const double gbs = bytes / (ms * 1e-3) / 1e9, gbs_graph = bytes / (ms_graph * 1e-3) / 1e9;
  for (const auto& q : qs) free_quant(q);
  device_free(x);
  device_free(y);
  return {{"N", N},
          {"K", K},
          {"bits", bits},
          {"group_size", gs},
          {"us", ms * 1e3},
          {"GB_s", gbs},
          {"pct_of_copy", 100.0 * gbs / copy_gbs},
          {"graph_us", ms_graph * 1e3},
          {"graph_GB_s", gbs_graph},
          {"graph_pct_of_copy", 100.0 * gbs_graph / copy_gbs}};
}

nlohmann::json gemm(int64_t M, int64_t N, int64_t K) {
  const cuda::QuantView q = random_quant(N, K, 4, 64, 1, 1);
  void* x = dalloc_bf16(static_cast<size_t>(M * K), 4, -1.f, 1.f);
  void* wd = device_alloc(static_cast<size_t>(N * K) * 2);
  void* y = device_alloc(static_cast<size_t>(M * N) * 2);
  cuda::dequantize(q, 0, N, wd, DType::BF16);
  const double ms_blas = median_ms(20, [&](int) { cuda::gemm(x, wd, DType::BF16, M, N, K, y, DType::BF16); });
  const double ms_ours = median_ms(20, [&](int) {
    cuda::dequantize(q, 0, N, wd, DType::BF16);
    cuda::gemm(x, wd, DType::BF16, M, N, K, y, DType::BF16);
  });
  free_quant(q);
  for (void* p : {x, wd, y}) device_free(p);
  const double flop = 2.0 * static_cast<double>(M * N * K);
  return {{"M", M},
          {"N", N},
          {"K", K},
          {"ours_us", ms_ours * 1e3},
          {"cublas_bf16_us", ms_blas * 1e3},
          {"ours_tflops", flop / (ms_ours * 1e-3) / 1e12},
          {"cublas_tflops", flop / (ms_blas * 1e-3) / 1e12},
          {"ratio", ms_blas / ms_ours}};
}

// The multi-row GEMM over kept dense bf16 weights (tensor/dense_weights.h) at decode-batch rows: 20 calls back
// to back over 2-8 weight copies (400 MB or more, 8x what L2 holds), as a step's layers run, against the copy
// bandwidth.
nlohmann::json dense_rows(int64_t M, int64_t N, int64_t K, double copy_gbs) {
  const size_t wbytes = static_cast<size_t>(N * K) * 2;
  const int copies = static_cast<int>(std::clamp<size_t>((size_t{400} << 20) / wbytes + 1, 2, 8)), calls = 20;
  std::vector<void*> ws;
  for (int c = 0; c < copies; ++c) ws.push_back(dalloc_bf16(static_cast<size_t>(N * K), 400 + c, -0.05f, 0.05f));
  void* x = dalloc_bf16(static_cast<size_t>(M * K), 8, -1.f, 1.f);
  void* y = device_alloc(static_cast<size_t>(M * N) * 2);
  const double ms = median_ms(20,
                              [&](int i) {
                                for (int c = 0; c < calls; ++c)
                                  cuda::gemm(x, ws[static_cast<size_t>((i * calls + c) % copies)], DType::BF16, M, N, K,
                                             y, DType::BF16);
                              }) /
                    calls;
  for (void* p : ws) device_free(p);
  device_free(x);
  device_free(y);
  const double gbs = static_cast<double>(wbytes) / (ms * 1e-3) / 1e9;
  return {
      {"M", M}, {"N", N}, {"K", K}, {"us", ms * 1e3}, {"weight_GB_s", gbs}, {"pct_of_copy", 100.0 * gbs / copy_gbs}};
}

// gemm_q4 (tensor/cuda/gemm_q4.h) at decode-batch rows over 4-bit g64 weights, 20 calls back to back over copies
// that miss the L2, next to dense_rows' cuBLAS over bf16 copies of the same shape: time, the bytes of codes,
// scales and biases read per second, and the tensor-core rate.
nlohmann::json q4_rows(int64_t M, int64_t N, int64_t K, double copy_gbs) {
  const size_t wbytes = static_cast<size_t>(N * K / 2), groups = static_cast<size_t>(N * K / 64);
  const size_t bytes = wbytes + groups * 4;
  const int copies = static_cast<int>(std::clamp<size_t>((size_t{400} << 20) / bytes + 1, 2, 16)), calls = 20;
  std::vector<cuda::QuantView> qs;
  for (int c = 0; c < copies; ++c) qs.push_back(random_quant(N, K, 4, 64, 500 + static_cast<uint32_t>(c), 100));
  void* x = dalloc_bf16(static_cast<size_t>(M * K), 9, -1.f, 1.f);
  void* y = device_alloc(static_cast<size_t>(M * N) * 2);
  const cuda::GemmQ4Plan plan = cuda::plan_gemm_q4(qs[0], x, M);
  const int chunks = static_cast<int>(K / 256);
  void* ws = device_alloc(static_cast<size_t>(std::max<int64_t>(8 * M * N, plan.workspace_floats)) * 4);
  auto time_plan = [&](const cuda::GemmQ4Plan& p) {
    return median_ms(20,
                     [&](int i) {
                       for (int c = 0; c < calls; ++c)
                         cuda::gemm_q4(p, qs[static_cast<size_t>((i * calls + c) % copies)], x, M, y, DType::BF16,
                                       nullptr, static_cast<float*>(ws));
                     }) /
           calls;
  };
  const double ms = time_plan(plan);
  // The same call at other split counts, to check the plan's estimate.
  nlohmann::json sweep = nlohmann::json::object();
  for (int sp : {1, 2, 3, 4, 6, 8}) {
    if (sp > chunks) continue;
    cuda::GemmQ4Plan p = plan;
    p.chunks_per_split = (chunks + sp - 1) / sp;
    p.splits = (chunks + p.chunks_per_split - 1) / p.chunks_per_split;
    sweep[std::to_string(p.splits)] = time_plan(p) * 1e3;
  }
  for (const auto& q : qs) free_quant(q);
  device_free(x);
  device_free(y);
  device_free(ws);
  const double gbs = static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
  const nlohmann::json dense = dense_rows(M, N, K, copy_gbs);
  return {{"M", M},
          {"N", N},
          {"K", K},
          {"splits", plan.splits},
          {"us_by_splits", sweep},
          {"us", ms * 1e3},
          {"weight_GB_s", gbs},
          {"pct_of_copy", 100.0 * gbs / copy_gbs},
          {"tflops", 2.0 * static_cast<double>(M * N * K) / (ms * 1e-3) / 1e12},
          {"dense_bf16_us", dense["us"]},
          {"speedup_vs_dense", dense["us"].get<double>() / (ms * 1e3)}};
}

// Microseconds a launch of f takes on the GPU: 20 launches captured in one CUDA graph (no host launch cost
// between them), the median over repeats of a replay, divided by 20.
template <class F>
double launch_us(F&& f) {
  cudaStream_t s = cuda::stream();
  f();  // first-use allocations happen outside the capture
  cudaGraph_t g;
  cudaGraphExec_t ge;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
  for (int i = 0; i < 20; ++i) f();
  cudaStreamEndCapture(s, &g);
  cudaGraphInstantiate(&ge, g, 0);
  const double ms = median_ms(15, [&](int) { cudaGraphLaunch(ge, s); });
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  return 1e3 * ms / 20.0;
}

// Qwen3-4B's decode attention shape (32 query heads, 8 kv heads, head size 128, bf16, a K/V cache laid out
// [S, Hkv, D]) writing to out; q, k, v, S and positions are each caller's.
constexpr int64_t kHq = 32, kHkv = 8, kD = 128;
cuda::AttentionArgs decode_args(void* out) {
  cuda::AttentionArgs a;
  a.out = out;
  a.t = DType::BF16;
  a.T = 1;
  a.Hq = kHq;
  a.Hkv = kHkv;
  a.D = a.Dv = kD;
  a.q_s0 = kHq * kD;
  a.q_s1 = kD;
  a.k_s0 = a.v_s0 = kHkv * kD;
  a.k_s1 = a.v_s1 = kD;
  a.scale = 0.0884f;
  a.causal = true;
  return a;
}

// One decode row at context S: a random query, K and V from their seeds, the query at the last position.
cuda::DecodeRow random_decode_row(int64_t S, uint32_t q_seed, uint32_t k_seed, uint32_t v_seed) {
  cuda::DecodeRow row;
  row.q = dalloc_bf16(static_cast<size_t>(kHq * kD), q_seed, -1.f, 1.f);
  row.k = dalloc_bf16(static_cast<size_t>(S * kHkv * kD), k_seed, -1.f, 1.f);
  row.v = dalloc_bf16(static_cast<size_t>(S * kHkv * kD), v_seed, -1.f, 1.f);
  row.S = S;
  row.q_pos0 = S - 1;
  return row;
}

void free_decode_row(const cuda::DecodeRow& row) {
  for (const void* p : {row.q, row.k, row.v}) device_free(const_cast<void*>(p));
}

// A device copy of the rows' table (free with device_free).
const cuda::DecodeRow* upload_rows(const std::vector<cuda::DecodeRow>& host) {
  void* rows = device_alloc(host.size() * sizeof(cuda::DecodeRow));
  device_copy(rows, host.data(), host.size() * sizeof(cuda::DecodeRow), Device::CUDA, Device::CPU);
  return static_cast<const cuda::DecodeRow*>(rows);
}

// One decode row at context S: the split kernel at its default splits and at fixed ones, and the wide kernel for
// that single row (8 blocks: it cannot fill the chip, which is what the split kernel is for).
nlohmann::json decode_attention_row(int64_t S, double copy_gbs) {
  const cuda::DecodeRow row = random_decode_row(S, 1, 2, 3);
  void* out = device_alloc(static_cast<size_t>(kHq * kD * 2 * 2));
  cuda::AttentionArgs a = decode_args(out);
  a.q = row.q;
  a.k = row.k;
  a.v = row.v;
  a.S = S;
  a.q_pos0 = S - 1;
  const int dflt = cuda::decode_attention_splits(a);
  float* part = static_cast<float*>(device_alloc(static_cast<size_t>(kHq * std::max(dflt, 64) * (kD + 4) * 4)));
  nlohmann::json r{{"context", S}, {"default_splits", dflt}};
  const double kv_bytes = 2.0 * static_cast<double>(S * kHkv * kD * 2);
  const double us = launch_us([&] { cuda::decode_attention(a, dflt, part); });
  r["split_default_us"] = us;
  r["split_default_pct_of_copy"] = 100.0 * kv_bytes / (us * 1e-6) / 1e9 / copy_gbs;
  for (int splits : {1, 4, 8, 16})
    r["split_" + std::to_string(splits) + "_us"] = launch_us([&] { cuda::decode_attention(a, splits, part); });
  const cuda::DecodeRow* table = upload_rows({row});
  r["wide_one_row_us"] = launch_us([&] { cuda::decode_attention_wide(a, table, 1); });
  free_decode_row(row);
  for (const void* p : {static_cast<const void*>(out), static_cast<const void*>(part), static_cast<const void*>(table)})
    device_free(const_cast<void*>(p));
  return r;
}

// n_rows decode rows at context S each (own K/V per row, so their bytes come from memory, not L2): the wide
// kernel (one block per row and kv head) and the split kernel's batched launch, against the K/V bytes read.
nlohmann::json decode_attention_rows(int64_t n_rows, int64_t S, double copy_gbs) {
  std::vector<cuda::DecodeRow> host;
  for (uint32_t r = 0; r < static_cast<uint32_t>(n_rows); ++r)
    host.push_back(random_decode_row(S, 10 + r, 1000 + r, 2000 + r));
  const cuda::DecodeRow* table = upload_rows(host);
  void* out = device_alloc(static_cast<size_t>(n_rows * kHq * kD * 2));
  const cuda::AttentionArgs a = decode_args(out);
  const int splits = cuda::decode_attention_splits(a);
  const int active = cuda::decode_attention_active_splits(S, splits);
  float* part = static_cast<float*>(device_alloc(static_cast<size_t>(n_rows * kHq * splits * (kD + 4) * 4)));
  const double bytes = 2.0 * static_cast<double>(n_rows * S * kHkv * kD * 2);
  nlohmann::json r{{"rows", n_rows}, {"context", S}, {"kv_mb", bytes / 1e6}};
  const double wide = launch_us([&] { cuda::decode_attention_wide(a, table, n_rows); });
  r["wide_us"] = wide;
  r["wide_pct_of_copy"] = 100.0 * bytes / (wide * 1e-6) / 1e9 / copy_gbs;
  r["split_rows_us"] = launch_us([&] { cuda::decode_attention_rows(a, table, n_rows, splits, active, part); });
  for (const auto& row : host) free_decode_row(row);
  for (const void* p : {static_cast<const void*>(out), static_cast<const void*>(part), static_cast<const void*>(table)})
    device_free(const_cast<void*>(p));
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const bool gemv_only = argc > 1 && std::strcmp(argv[1], "--gemv-only") == 0;
  const bool dense_only = argc > 1 && std::strcmp(argv[1], "--dense-rows") == 0;
  if (!cuda_available()) {
    std::fprintf(stderr, "cuda_kernels: no CUDA device\n");
    return 1;
  }
  nlohmann::json out;
  const double copy = copy_bandwidth();
  out["copy_GB_s"] = copy;
  if (argc > 1 && std::strcmp(argv[1], "--q4-rows") == 0) {  // the same shapes through gemm_q4
    for (int64_t M : {16, 32, 64, 128})
      for (auto [N, K] :
           {std::pair<int64_t, int64_t>{6144, 2560}, {2560, 4096}, {19456, 2560}, {2560, 9728}, {151936, 2560}})
        out["q4_rows"].push_back(q4_rows(M, N, K, copy));
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  if (argc > 1 && std::strcmp(argv[1], "--decode-attention") == 0) {
    for (int64_t S : {16, 64, 150, 256, 1024, 4096, 16384})
      out["decode_attention"].push_back(decode_attention_row(S, copy));
    for (int64_t B : {16, 64, 128})
      for (int64_t S : {160, 512, 2048}) out["decode_attention_rows"].push_back(decode_attention_rows(B, S, copy));
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  if (dense_only) {  // Qwen3-4B's matmuls in a wide decode step: q|k|v, o_proj, gate (and up), down_proj, lm_head
    for (int64_t M : {16, 32, 64, 128})
      for (auto [N, K] :
           {std::pair<int64_t, int64_t>{6144, 2560}, {2560, 4096}, {9728, 2560}, {2560, 9728}, {151936, 2560}})
        out["dense_rows"].push_back(dense_rows(M, N, K, copy));
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  // Llama-8B MLP shapes, then Qwen3-4B's decode GEMVs (q|k|v and gate|up stacked, o_proj, down_proj).
  for (auto [N, K] : {std::pair<int64_t, int64_t>{4096, 14336},
                      {14336, 4096},
                      {9728, 2560},
                      {2560, 9728},
                      {6144, 2560},
                      {19456, 2560},
                      {2560, 4096}}) {
    out["gemv"].push_back(gemv(N, K, 4, 64, copy));
    out["gemv"].push_back(gemv(N, K, 8, 32, copy));
  }
  if (!gemv_only)
    for (int64_t M : {512, 4096})
      for (auto [N, K] : {std::pair<int64_t, int64_t>{4096, 2560}, {9728, 2560}, {2560, 9728}, {14336, 4096}})
        out["gemm"].push_back(gemm(M, N, K));
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
#else
#include <cstdio>
#include <cstring>
int main() {
  std::fprintf(stderr, "cuda_kernels: built without the CUDA backend\n");
  return 1;
}
#endif
