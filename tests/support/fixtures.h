// Test helpers: where the fixtures are, and reading a fixture model's reference logits and prompts.
#pragma once
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/mapped_file.h"
#include "io/safetensors.h"

namespace lathe::test {

// LATHE_FIXTURES_DIR in the environment wins (tests run from another checkout, e.g. on the GPU machine).
inline std::string fixtures_dir() {
  if (const char* env = std::getenv("LATHE_FIXTURES_DIR")) return env;
  return LATHE_FIXTURES_DIR;
}
inline std::string model_dir(const std::string& name) { return fixtures_dir() + "/models/" + name; }

struct Reference {
  std::map<std::string, std::vector<int32_t>> prompts;  // chat, long, one, chat_greedy
  std::vector<int32_t> greedy;                          // greedy_continuation after chat
  std::shared_ptr<SafetensorsFile> logits;              // logits_<prompt>: f32 [T, vocab]
};

inline Reference load_reference(const std::string& model) {
  Reference r;
  const auto j = nlohmann::json::parse(read_text_file(model_dir(model) + "/reference.json"));
  for (auto it = j["prompts"].begin(); it != j["prompts"].end(); ++it)
    r.prompts[it.key()] = it.value().get<std::vector<int32_t>>();
  r.greedy = j["greedy_continuation"].get<std::vector<int32_t>>();
  r.logits = SafetensorsFile::open(model_dir(model) + "/reference.safetensors");
  return r;
}

struct Agreement {
  double max_abs_diff = 0, max_abs_ref = 0;
  int64_t rows = 0, argmax_mismatches = 0;
  bool within(double rel = 1e-3) const { return max_abs_diff <= rel * std::max(1.0, max_abs_ref); }
};

// Compares [T, V] logits row by row: max |Δ|, max |ref| and argmax agreement.
inline Agreement compare_logits(const std::vector<float>& got, const std::vector<float>& ref, int64_t vocab) {
  Agreement a;
  a.rows = static_cast<int64_t>(ref.size()) / vocab;
  for (int64_t t = 0; t < a.rows; ++t) {
    int64_t ag = 0, ar = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      const size_t i = static_cast<size_t>(t * vocab + v);
      a.max_abs_diff = std::max(a.max_abs_diff, static_cast<double>(std::abs(got[i] - ref[i])));
      a.max_abs_ref = std::max(a.max_abs_ref, static_cast<double>(std::abs(ref[i])));
      if (got[i] > got[static_cast<size_t>(t * vocab + ag)]) ag = v;
      if (ref[i] > ref[static_cast<size_t>(t * vocab + ar)]) ar = v;
    }
    if (ag != ar) ++a.argmax_mismatches;
  }
  return a;
}

}  // namespace lathe::test
