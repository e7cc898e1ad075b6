// End-to-end CUDA benchmark of one checkpoint: prefill tok/s and time to first token for 512- and 4096-token
// prompts, single-stream greedy decode tok/s at context 128 and 4096, peak device memory, and the cudaMalloc
// calls made inside the decode loops (should be 0); with --batch, batched decode (Model::forward(const Batch&),
// one step for B sequences, argmax on the device) at each listed batch size. Prints one JSON object.
// Usage: cuda_e2e --model DIR [--dtype bf16|f32] [--decode-steps N] [--decode-only CTX] [--batch 1,8,32]
//        [--batch-steps 32] [--batch-context 128] [--prefill-batch B] [--dense-weights auto|on|off|BYTES]
// --prefill-batch B: only one forward that prefills B prompts of --batch-context tokens (a serve admission step).
// --dense-weights: the dense weight copies' budget, as `lathe serve --cuda-dense-weights` sets it (default auto).
// --decode-only: no warm-up or prefill runs, one decode run at CTX (for profilers: a short, predictable launch
// sequence — the CTX-token prefill, then decode steps).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "engine/dense_weights_budget.h"
#include "engine/kv_budget.h"
#include "model/model.h"
#include "tensor/dense_weights.h"
#include "tensor/device_memory.h"
#include "tensor/ops.h"

// bench/kernel_trace (preloaded on the device) defines this to bracket the kernels it reports.
extern "C" void lathe_ktrace_window(int on) __attribute__((weak));

namespace {
using namespace lathe;
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }
CacheOptions g_cache;  // --kv-bits: every sequence's K/V storage

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(std::min<int64_t>(vocab, 100000) - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& x : ids) x = d(rng);
  return ids;
}

// Time to first token for a fresh prompt: prefill (last logits only) + the argmax read back.
double prefill_ms(Model& m, const std::vector<int32_t>& ids, int reps) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    CacheList cache = m.make_cache(g_cache);
    const auto t0 = Clock::now();
    (void)argmax_rows(m.forward(ids, cache, false));
    t.push_back(ms_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

nlohmann::json decode(Model& m, int64_t ctx, int steps, int64_t vocab) {
  CacheList cache = m.make_cache(g_cache);
  int32_t next = argmax_rows(m.forward(random_ids(ctx, vocab, 5), cache, false))[0];
  // Warm-up: the first step may grow the cache (a new KV block), the next captures the decode graph.
  for (int i = 0; i < 2; ++i) next = argmax_rows(m.forward({next}, cache, false))[0];
  const uint64_t mallocs = device_memory_stats().malloc_calls;
  std::vector<double> step;
  const auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) {
    const auto ts = Clock::now();
    next = argmax_rows(m.forward({next}, cache, false))[0];
    step.push_back(ms_since(ts));
  }
  const double total = ms_since(t0);
  std::sort(step.begin(), step.end());
  return {{"context", ctx},
          {"steps", steps},
          {"tok_s", steps / (total / 1000.0)},
          {"median_step_ms", step[step.size() / 2]},
          {"malloc_calls_in_loop", device_memory_stats().malloc_calls - mallocs}};
}

// B sequences prefilled to ctx tokens each, then `steps` batched decode steps (one row per sequence). B = 1 runs
// the same Batch path, which a single row takes to the solo decode graph. Afterwards the first and the last
// sequence are decoded again alone: greedy_equal_solo says whether their tokens matched the batched ones.
nlohmann::json decode_batched(Model& m, int64_t ctx, int batch, int steps, int64_t vocab) {
  const size_t B = static_cast<size_t>(batch);
  std::vector<CacheList> caches(B);
  std::vector<std::vector<int32_t>> toks(B);
  auto prompt = [&](size_t b) { return random_ids(ctx, vocab, 7 + static_cast<uint32_t>(b)); };
  for (size_t b = 0; b < B; ++b) {
    caches[b] = m.make_cache(g_cache);
    toks[b].push_back(argmax_rows(m.forward(prompt(b), caches[b], false))[0]);
  }
  auto last_tokens = [&] {  // one decode row per sequence, fed its last token
    Batch bt;
    for (size_t b = 0; b < B; ++b) bt.rows.push_back({{toks[b].back()}, &caches[b], true, -1});
    return bt;
  };
  double host_ms = 0;  // the last step's time until forward() returned: the host queueing its kernels
  auto step = [&] {
    const auto ts = Clock::now();
    const Tensor logits = m.forward(last_tokens());
    host_ms = ms_since(ts);
    const std::vector<int32_t> next = argmax_rows(logits);
    for (size_t b = 0; b < B; ++b) toks[b].push_back(next[b]);
  };
  for (int i = 0; i < 2; ++i) step();  // warm-up (KV growth, graph capture, cuBLAS heuristics)
  device_synchronize();
  const uint64_t mallocs = device_memory_stats().malloc_calls;
  std::vector<double> times, host;
  const auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) {
    const auto ts = Clock::now();
    step();
    times.push_back(ms_since(ts));
    host.push_back(host_ms);
  }
  const double total = ms_since(t0);
  const uint64_t loop_mallocs = device_memory_stats().malloc_calls - mallocs;
  // The slowest steps by index: a step where every row's K/V grows (contexts crossing a multiple of the cache's
  // growth step) stands out here, where the median hides it.
  std::vector<size_t> order(times.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const size_t shown = std::min<size_t>(4, order.size());
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(shown), order.end(),
                    [&](size_t a, size_t b) { return times[a] > times[b]; });
  nlohmann::json slowest = nlohmann::json::array();
  for (size_t i = 0; i < shown; ++i)
    slowest.push_back({{"step", order[i]},
                       {"context", ctx + 2 + static_cast<int64_t>(order[i])},
                       {"ms", times[order[i]]},
                       {"host_ms", host[order[i]]}});
  double sum_ms = 0;
  for (double t : times) sum_ms += t;
  std::sort(times.begin(), times.end());
  std::sort(host.begin(), host.end());
  bool equal = true;
  for (size_t b : {size_t{0}, B - 1}) {
    CacheList solo = m.make_cache(g_cache);
    std::vector<int32_t> t{argmax_rows(m.forward(prompt(b), solo, false))[0]};
    while (t.size() < toks[b].size()) t.push_back(argmax_rows(m.forward({t.back()}, solo, false))[0]);
    equal = equal && t == toks[b];
  }
  // The same steps queued back to back, each row feeding its last token again and no ids read until the end:
  // the step time a loop that queues step N+1 before reading step N's ids would reach (max of host and GPU).
  device_synchronize();
  if (lathe_ktrace_window) lathe_ktrace_window(1);
  const auto tp = Clock::now();
  for (int i = 0; i < steps; ++i) (void)m.forward(last_tokens());
  device_synchronize();
  const double pipelined_ms = ms_since(tp) / steps;
  if (lathe_ktrace_window) lathe_ktrace_window(0);
  return {{"batch", batch},
          {"context", ctx},
          {"pipelined_step_ms", pipelined_ms},
          {"steps", steps},
          {"tok_s", static_cast<double>(batch) * steps / (total / 1000.0)},
          {"median_step_ms", times[times.size() / 2]},
          {"median_host_ms", host[host.size() / 2]},
          {"mean_step_ms", sum_ms / static_cast<double>(times.size())},
          {"slowest_steps", slowest},
          {"malloc_calls_in_loop", loop_mallocs},
          {"greedy_equal_solo", equal}};
}

// B sequences of ctx tokens prefilled in one forward (one Batch of B prompt rows, as `lathe serve` admits B
// requests at once), each from a fresh cache: the step behind the time to first token of B concurrent streams.
// The last of `reps` timed runs is the one a kernel trace window covers.
nlohmann::json prefill_batched(Model& m, int64_t ctx, int batch, int reps, int64_t vocab) {
  auto run = [&](bool traced) {
    std::vector<CacheList> caches(static_cast<size_t>(batch));
    Batch bt;
    for (int b = 0; b < batch; ++b) {
      caches[static_cast<size_t>(b)] = m.make_cache(g_cache);
      bt.rows.push_back(
          {random_ids(ctx, vocab, 11 + static_cast<uint32_t>(b)), &caches[static_cast<size_t>(b)], true, -1});
    }
    device_synchronize();
    if (traced && lathe_ktrace_window) lathe_ktrace_window(1);
    const auto t = Clock::now();
    (void)argmax_rows(m.forward(bt));
    const double ms = ms_since(t);
    if (traced && lathe_ktrace_window) lathe_ktrace_window(0);
    return ms;
  };
  run(false);  // warm-up: cuBLAS heuristics for the wide shapes, allocator bins
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) times.push_back(run(i + 1 == reps));
  std::sort(times.begin(), times.end());
  const double med = times[times.size() / 2];
  return {{"batch", batch},
          {"context", ctx},
          {"median_ms", med},
          {"min_ms", times.front()},
          {"tok_s", static_cast<double>(batch) * static_cast<double>(ctx) / (med / 1000.0)}};
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, dtype = "bf16", dense = "auto";
  int steps = 128, batch_steps = 32;
  int64_t batch_context = 128;
  int64_t decode_only = 0;
  int prefill_batch = 0;
  std::vector<int> batches;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model")) dir = argv[i + 1];
    if (!std::strcmp(argv[i], "--dtype")) dtype = argv[i + 1];
    if (!std::strcmp(argv[i], "--dense-weights")) dense = argv[i + 1];
    if (!std::strcmp(argv[i], "--decode-steps")) steps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--batch-steps")) batch_steps = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--batch-context")) batch_context = std::max<int64_t>(1, std::atoll(argv[i + 1]));
    if (!std::strcmp(argv[i], "--decode-only")) decode_only = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--kv-bits")) g_cache.kv_bits = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--prefill-batch")) prefill_batch = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--batch"))
      for (const char* p = argv[i + 1]; *p; ++p)
        if (p == argv[i + 1] || p[-1] == ',') batches.push_back(std::atoi(p));
  }
  if (dir.empty()) {
    std::fprintf(
        stderr,
        "usage: cuda_e2e --model DIR [--dtype bf16|f32] [--decode-steps N] [--decode-only CTX] [--batch 1,8,32] "
        "[--batch-steps 32] [--batch-context 128] [--prefill-batch B] [--dense-weights auto|on|off|BYTES] "
        "[--kv-bits 0|4|8]\n");
    return 2;
  }
  if (!cuda_available()) {
    std::fprintf(stderr, "cuda_e2e: no CUDA device\n");
    return 1;
  }
  try {
    const auto tl = Clock::now();
    auto model = load_model(dir, LoadOptions{Device::CUDA, dtype == "f32" ? DType::F32 : DType::BF16});
    device_synchronize();
    const double load_ms = ms_since(tl);
    const int64_t vocab = model->config().vocab_size;
    const size_t weights_bytes = device_memory_stats().in_use_bytes;
    set_dense_weight_budget(
        dense_weights_budget(parse_dense_weights(dense), device_free_bytes(), default_kv_cache_bytes()));
    auto dense_stats = [&] {
      const DenseWeightStats d = dense_weight_stats();
      return nlohmann::json{{"setting", dense},
                            {"budget_mib", static_cast<double>(d.budget_bytes) / 1048576.0},
                            {"held_mib", static_cast<double>(d.held_bytes) / 1048576.0},
                            {"copies", d.copies},
                            {"over_budget", d.over_budget}};
    };
    if (prefill_batch > 0) {  // --prefill-batch B: only the batched prefill of B × --batch-context tokens
      nlohmann::json out = prefill_batched(*model, batch_context, prefill_batch, 3, vocab);
      out["model"] = dir;
      out["dense_weights"] = dense_stats();
      out["peak_device_mib"] = static_cast<double>(device_memory_stats().peak_reserved_bytes) / 1048576.0;
      std::printf("%s\n", out.dump().c_str());
      return 0;
    }
    if (!batches.empty()) {
      nlohmann::json out = {{"model", dir},
                            {"dtype", dtype},
                            {"kv_bits", g_cache.kv_bits},
                            {"weights_device_mib", weights_bytes / 1048576.0}};
      for (int b : batches) {
        if (b < 1) continue;
        out["batched_decode"].push_back(decode_batched(*model, batch_context, b, batch_steps, vocab));
        std::fprintf(stderr, "%s\n", out["batched_decode"].back().dump().c_str());
      }
      out["peak_device_mib"] = static_cast<double>(device_memory_stats().peak_reserved_bytes) / 1048576.0;
      out["dense_weights"] = dense_stats();
      std::printf("%s\n", out.dump().c_str());
      return 0;
    }
    if (decode_only > 0) {
      std::printf("%s\n", decode(*model, decode_only, steps, vocab).dump().c_str());
      return 0;
    }
    prefill_ms(*model, random_ids(64, vocab, 1), 2);  // warm-up: module load, cuBLAS heuristics
    nlohmann::json out = {{"model", dir},
                          {"dtype", dtype},
                          {"load_ms", load_ms},
                          {"weights_device_mib", static_cast<double>(weights_bytes) / 1048576.0}};
    for (int64_t n : {512, 4096}) {
      const double ms = prefill_ms(*model, random_ids(n, vocab, 2), 3);
      out["prefill"].push_back({{"tokens", n}, {"ttft_ms", ms}, {"tok_s", n / (ms / 1000.0)}});
    }
    out["decode"].push_back(decode(*model, 128, std::min(steps, 120), vocab));  // stays within one KV block
    out["decode"].push_back(decode(*model, 4096, std::min(steps, 64), vocab));
    const DeviceMemoryStats mem = device_memory_stats();
    out["peak_device_mib"] = static_cast<double>(mem.peak_reserved_bytes) / 1048576.0;
    out["malloc_calls_total"] = mem.malloc_calls;
    out["dense_weights"] = dense_stats();
    std::printf("%s\n", out.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_e2e: %s\n", e.what());
    return 2;
  }
  return 0;
}
