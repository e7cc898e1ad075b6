// KV file restore against its two alternatives, in one run: recomputing the prefix (prefill) and reading the
// file's bytes from the same medium with plain sequential reads (the read bandwidth the restore can reach).
// Usage: kv_restore MODEL_DIR TMP_DIR [tokens...] [--kv-bits N] [--random-kv]
// For each prefix length: prefill T random tokens (cold TTFT: T tokens to the first logits), save, evict the
// file from the page cache (posix_fadvise DONTNEED), time a sequential read of the file (medium bandwidth),
// evict again, time load_kv_file into fresh caches + a one-token forward (SSD-hit TTFT), then the same from
// the page cache (RAM-resident file). Prints one JSON line per length.
// --random-kv fills full-attention caches with random rows instead of the prefill (no cold TTFT then): the
// restore's figures in seconds rather than the minutes a CPU prefill of thousands of tokens takes.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_main.h"
#include "cache/cache_identity.h"
#include "cache/kv_file.h"
#include "model/model.h"

using namespace lathe;
using Clock = std::chrono::steady_clock;

static double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

static void evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// Caches holding T random rows per layer (full-attention "kv" layouts only: what the restore reads is bytes).
static CacheList random_caches(Model& model, const CacheOptions& opts, const CacheLayout& layout, int64_t T,
                               std::mt19937& rng) {
  CacheList caches = model.make_cache(opts);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (size_t i = 0; i < caches.size(); ++i) {
    const CacheLayout::Layer& l = layout.layers[i];
    if (l.kind != "kv" || l.tensors.size() != 2) {
      std::fprintf(stderr, "kv_restore: --random-kv needs full-attention kv caches (layer %zu is %s)\n", i,
                   l.kind.c_str());
      std::exit(2);
    }
    Tensor kv[2];
    for (int t = 0; t < 2; ++t) {
      Shape shape = l.tensors[static_cast<size_t>(t)].shape;
      shape[0] = T;
      std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
      for (float& x : v) x = u(rng);
      kv[t] = Tensor::from_floats(v, shape).to(l.tensors[static_cast<size_t>(t)].dtype).to(layout.device);
    }
    caches[i]->update(kv[0], kv[1]);
  }
  return caches;
}

static double read_ms(const std::string& path, uint64_t* bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  std::vector<char> buf(8u << 20);
  *bytes = 0;
  const auto t = Clock::now();
  for (ssize_t n; (n = ::read(fd, buf.data(), buf.size())) > 0;) *bytes += static_cast<uint64_t>(n);
  const double ms = ms_since(t);
  ::close(fd);
  return ms;
}

namespace {

int run(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: kv_restore MODEL_DIR TMP_DIR [tokens...] [--kv-bits N]\n");
    return 2;
  }
  const std::string model_dir = argv[1], tmp = argv[2];
  std::vector<int> lengths;
  CacheOptions opts;
  bool random_kv = false;
  for (int i = 3; i < argc; ++i) {
    if (std::string(argv[i]) == "--kv-bits" && i + 1 < argc)
      opts.kv_bits = std::atoi(argv[++i]);
    else if (std::string(argv[i]) == "--random-kv")
      random_kv = true;
    else
      lengths.push_back(std::atoi(argv[i]));
  }
  if (lengths.empty()) lengths = {4096};
  auto model = load_model(model_dir);
  const CacheIdentity id = cache_identity(*model, opts);
  const CacheLayout layout = probe_cache_layout(*model, opts);
  std::mt19937 rng(1);
  for (int T : lengths) {
    std::vector<int32_t> ids(static_cast<size_t>(T));
    for (auto& x : ids) x = static_cast<int32_t>(rng() % 1000 + 10);
    // Cold: the whole prompt to the first logits.
    CacheList cold;
    auto t = Clock::now();
    double prefill_ms = 0;
    if (random_kv) {
      cold = random_caches(*model, opts, layout, T, rng);
    } else {
      cold = model->make_cache(opts);
      model->forward(ids, cold, false);
      prefill_ms = ms_since(t);
    }
    // What an SSD hit reuses: everything but the last token, which still runs (dropped from the cold caches
    // when they allow it, else computed again).
    const std::vector<int32_t> head(ids.begin(), ids.end() - 1);
    bool trimmable = true;
    for (const auto& c : cold) trimmable = trimmable && c->can_trim(1);
    CacheList warm;
    if (trimmable) {
      for (const auto& c : cold) c->trim(1);
      warm = std::move(cold);
    } else {
      cold.clear();
      warm = model->make_cache(opts);
      model->forward(head, warm, false);
    }
    const std::string path = tmp + "/bench.lkv";
    t = Clock::now();
    const uint64_t file_bytes = save_kv_file(path, head, warm, id.meta);
    const double save_ms = ms_since(t);
    warm.clear();

    evict(path);
    uint64_t read_bytes = 0;
    const double seq_ms = read_ms(path, &read_bytes);
    KvLoadStats ssd_stats, ram_stats;
    auto restore = [&](double* load_ms, KvLoadStats* st) {
      CacheList c = model->make_cache(opts);
      const auto t0 = Clock::now();
      KvLoadOptions lo;
      lo.expect = &id.meta;
      lo.stats = st;
      load_kv_file(path, layout, c, lo);
      *load_ms = ms_since(t0);
      model->forward({ids.back()}, c, false);
      return ms_since(t0);
    };
    evict(path);
    double ssd_load_ms = 0, ram_load_ms = 0;
    const double ssd_ttft = restore(&ssd_load_ms, &ssd_stats);
    const double ram_ttft = restore(&ram_load_ms, &ram_stats);  // the file's pages are now in the page cache
    const double mb = static_cast<double>(file_bytes) / 1e6;
    nlohmann::json j = {{"tokens", T},
                        {"kv_bits", opts.kv_bits},
                        {"file_mb", mb},
                        {"prefill_ms", prefill_ms},
                        {"save_ms", save_ms},
                        {"medium_read_mb_s", static_cast<double>(read_bytes) / 1e6 / (seq_ms / 1000)},
                        {"restore_cold_ms", ssd_load_ms},
                        {"restore_cold_mb_s", mb / (ssd_load_ms / 1000)},
                        {"restore_cold_wait_ms", ssd_stats.wait_ms},
                        {"restore_cold_copy_ms", ssd_stats.copy_ms},
                        {"restore_page_cache_wait_ms", ram_stats.wait_ms},
                        {"restore_page_cache_copy_ms", ram_stats.copy_ms},
                        {"ttft_cold_ms", random_kv ? nlohmann::json() : nlohmann::json(prefill_ms)},
                        {"ttft_ssd_hit_ms", ssd_ttft},
                        {"ttft_page_cache_hit_ms", ram_ttft},
                        {"restore_page_cache_mb_s", mb / (ram_load_ms / 1000)},
                        {"speedup_ssd_hit", random_kv ? nlohmann::json() : nlohmann::json(prefill_ms / ssd_ttft)}};
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
    ::unlink(path.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return bench::run_reporting_errors("kv_restore", [&] { return run(argc, argv); });
}
