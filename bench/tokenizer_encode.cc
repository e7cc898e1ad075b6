// Encode throughput of a tokenizer on >= 1 MB of mixed text (English prose, code, numbers, accented Latin,
// CJK, emoji), single thread. Usage: tokenizer_encode [TOKENIZER_DIR] [MEGABYTES]
// TOKENIZER_DIR defaults to the repo's qwen3-real fixture; tokenizer.json may be stored as tokenizer.json.gz.
#include <zlib.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench_main.h"
#include "tokenizer/tokenizer.h"

namespace {

std::string read_maybe_gzipped(const std::filesystem::path& path) {
  if (std::filesystem::exists(path)) {
    std::ifstream f(path, std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  gzFile f = gzopen((path.string() + ".gz").c_str(), "rb");
  if (!f) return {};
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  gzclose(f);
  return out;
}

// Deterministic mixed text: words drawn from several scripts and styles with a fixed LCG, so repeated words
// (as in real text) and new ones both occur.
std::string mixed_text(size_t bytes) {
  static const std::vector<std::string> words = {
      "the",
      "quick",
      "brown",
      "fox",
      "jumps",
      "over",
      "lazy",
      "dog",
      "tokenizer",
      "benchmark",
      "throughput",
      "language",
      "model",
      "inference",
      "isn't",
      "we'll",
      "they're",
      "Hello",
      "World",
      "naïve",
      "café",
      "résumé",
      "Zürich",
      "São",
      "Paulo",
      "über",
      "straße",
      "你好",
      "世界",
      "机器学习",
      "语言模型",
      "こんにちは",
      "東京",
      "カタカナ",
      "안녕하세요",
      "Привет",
      "мир",
      "γειά",
      "σου",
      "مرحبا",
      "🙂",
      "🚀",
      "👍🏽",
      "3.14159",
      "2026",
      "-42",
      "1234567890",
      "def",
      "return",
      "x",
      "=",
      "(",
      ")",
      "{",
      "}",
      "[i]",
      "==",
      "->",
      "std::vector<int>",
      "print('ok')",
      "#include",
      "<stdio.h>",
      "\n",
      "\n\n",
      "\t",
      "    ",
      ",",
      ".",
      "!",
      "?",
      ":",
      ";",
      "\"quoted\"",
  };
  std::string out;
  out.reserve(bytes + 64);
  uint64_t state = 0x9E3779B97F4A7C15ull;
  while (out.size() < bytes) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const std::string& w = words[(state >> 33) % words.size()];
    out += w;
    if (((state >> 20) & 7) != 0) out += ' ';
    if (((state >> 40) & 63) == 0) out += std::to_string(state >> 50);  // fresh numbers defeat the word cache
  }
  return out;
}

// CPU time of this thread: on a shared machine it measures the encoder, not the neighbours.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

namespace {

int run(int argc, char** argv) {
  const std::filesystem::path dir =
      argc > 1 ? std::filesystem::path(argv[1])
               : std::filesystem::path(__FILE__).parent_path().parent_path() / "tests/fixtures/tokenizers/qwen3-real";
  const double megabytes = argc > 2 ? std::atof(argv[2]) : 4.0;
  using Clock = std::chrono::steady_clock;
  const auto t_load = Clock::now();
  const std::string json = read_maybe_gzipped(dir / "tokenizer.json");
  if (json.empty()) {
    std::fprintf(stderr, "no tokenizer.json(.gz) in %s\n", dir.c_str());
    return 1;
  }
  const auto tok = lathe::Tokenizer::from_json(json, read_maybe_gzipped(dir / "tokenizer_config.json"));
  const double load_s = std::chrono::duration<double>(Clock::now() - t_load).count();

  const std::string text = mixed_text(static_cast<size_t>(megabytes * 1e6));
  tok->encode(text.substr(0, 100000));  // warm-up (page faults, regex JIT stack)
  double best_wall = 1e30, best_cpu = 1e30;
  size_t n_ids = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t = Clock::now();
    const double c = thread_cpu_seconds();
    n_ids = tok->encode(text).size();
    best_cpu = std::min(best_cpu, thread_cpu_seconds() - c);
    best_wall = std::min(best_wall, std::chrono::duration<double>(Clock::now() - t).count());
  }
  const double mb = static_cast<double>(text.size()) / 1e6;
  std::printf(
      "{\"tokenizer\": \"%s\", \"text_bytes\": %zu, \"tokens\": %zu, \"encode_cpu_s\": %.4f, "
      "\"encode_mb_s_cpu\": %.2f, \"encode_mb_s_wall\": %.2f, \"load_s\": %.3f}\n",
      dir.filename().c_str(), text.size(), n_ids, best_cpu, mb / best_cpu, mb / best_wall, load_s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return bench::run_reporting_errors("tokenizer_encode", [&] { return run(argc, argv); });
}
