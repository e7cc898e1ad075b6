// Structured-output cost on the host path, per generated token: the grammar mask over a real vocabulary (Qwen3's
// 151k tokens) and the sampler step with and without it. A JSON answer to a schema is re-tokenized and fed token
// by token, as decoding would: each step computes the mask (cold: a fresh state graph per step), then the sampler
// step over 151k logits with the constraint, for a schema's first request and for the same schema again (masks
// shared by grammar state, as serving runs it).
// Usage: grammar_mask [TOKENIZER_DIR]   (default: tests/fixtures/tokenizers/qwen3-real, .gz files accepted)
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "chat/grammar/gbnf.h"
#include "chat/grammar/grammar_constraint.h"
#include "chat/grammar/grammar_matcher.h"
#include "chat/grammar/json_schema.h"
#include "engine/sampler.h"
#include "tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

std::string read_maybe_gz(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (f) {
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  gzFile g = gzopen((path + ".gz").c_str(), "rb");
  if (!g) throw std::runtime_error("cannot read " + path + "(.gz)");
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(g, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  gzclose(g);
  return out;
}

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

}  // namespace

int main(int argc, char** argv) {
  using namespace lathe;
  const std::string dir = argc > 1 ? argv[1] : std::string(LATHE_SOURCE_DIR) + "/tests/fixtures/tokenizers/qwen3-real";
  auto tok =
      Tokenizer::from_json(read_maybe_gz(dir + "/tokenizer.json"), read_maybe_gz(dir + "/tokenizer_config.json"));
  auto t0 = Clock::now();
  auto trie = grammar::TokenTrie::build(*tok);
  const double trie_ms = ms_since(t0);

  const auto schema = nlohmann::ordered_json::parse(R"({"type":"object","properties":{
    "name":{"type":"string"},"age":{"type":"integer"},"email":{"type":"string"},
    "tags":{"type":"array","items":{"type":"string"}},"address":{"type":"object","properties":{
      "street":{"type":"string"},"city":{"type":"string"},"zip":{"type":"string"}},"required":["street","city","zip"]},
    "active":{"type":"boolean"}},"required":["name","age","email","tags","address","active"]})");
  const std::string answer =
      R"({"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["math", "engines", "poetry"], )"
      R"("address": {"street": "12 St James's Square", "city": "London", "zip": "SW1Y 4JH"}, "active": true})";
  t0 = Clock::now();
  auto g = std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(grammar::json_schema_to_gbnf(schema, "s")));
  const double compile_ms = ms_since(t0);
  const std::vector<int32_t> ids = tok->encode(answer);
  const int32_t eos = *tok->token_to_id("<|im_end|>");
  grammar::ConstraintOptions opt{{eos}, {}, -1};

  // Cold: the mask of every state computed from scratch.
  grammar::StackSet s = grammar::StackSet::start(*g);
  double cold_ms = 0, cold_max = 0;
  size_t allowed_sum = 0;
  for (int32_t id : ids) {
    t0 = Clock::now();
    const auto mask = grammar::allowed_tokens(*g, *trie, s, opt);
    const double ms = ms_since(t0);
    cold_ms += ms;
    cold_max = std::max(cold_max, ms);
    allowed_sum += static_cast<size_t>(std::count(mask.begin(), mask.end(), 1));
    if (!mask[static_cast<size_t>(id)]) {
      std::fprintf(stderr, "token %d of the answer was masked out\n", id);
      return 1;
    }
    for (uint32_t cp : trie->text(id)) s = s.advance(*g, cp);
  }

  // The sampler step over 151k logits, with the constraint (warm cache after the first pass) and without.
  std::vector<float> logits(tok->vocab_size());
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>((i * 2654435761u) % 1000) / 100.0f;
  auto c = std::make_shared<grammar::GrammarConstraint>(g, trie, opt);
  auto run = [&](bool constrained, int passes) {
    double total = 0;
    for (int p = 0; p < passes; ++p) {
      SamplingParams sp;
      if (constrained) sp.constraint = c;
      Sampler sampler(sp, {eos});
      for (int32_t id : ids) {
        std::vector<float> l = logits;
        l[static_cast<size_t>(id)] = 100.0f;  // the answer's next token wins, so the walk follows the answer
        t0 = Clock::now();
        sampler.sample(l, {});
        total += ms_since(t0);
      }
    }
    return total / (passes * static_cast<double>(ids.size()));
  };
  const double plain = run(false, 3);
  const double first = run(true, 1);        // the schema's first request: masks computed as decoding goes
  const double constrained = run(true, 3);  // the same schema again: masks shared by grammar state

  nlohmann::ordered_json out = {{"bench", "grammar_mask"},
                                {"vocab", tok->vocab_size()},
                                {"trie_build_ms", trie_ms},
                                {"schema_compile_ms", compile_ms},
                                {"answer_tokens", ids.size()},
                                {"mask_cold_mean_us", 1e3 * cold_ms / static_cast<double>(ids.size())},
                                {"mask_cold_max_us", 1e3 * cold_max},
                                {"mean_allowed_tokens", allowed_sum / ids.size()},
                                {"sample_us_plain", 1e3 * plain},
                                {"sample_us_first_request", 1e3 * first},
                                {"sample_us_repeat_request", 1e3 * constrained},
                                {"overhead_us_per_token_first", 1e3 * (first - plain)},
                                {"overhead_us_per_token_repeat", 1e3 * (constrained - plain)}};
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
