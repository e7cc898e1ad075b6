// Structured-output cost on the host path, per generated token: the grammar mask over a real vocabulary (Qwen3's
// 151k tokens) and the sampler step with and without it. A JSON answer to a schema is re-tokenized and fed token
// by token, as decoding would: each step computes the mask (cold: a fresh state graph per step), then the sampler
// step over 151k logits with the constraint, for a schema's first request and for the same schema again (masks
// shared by grammar state, as serving runs it). Each sampler figure twice: with the chosen token's logprob wanted
// (the full mask every step) and without (greedy checks only the token it picks; the server asks for the logprob
// only when the request does), and a sampled step (temperature 0.8, seeded: the full mask every step too). The
// full-mask figures come twice, from the per-position token tables (token_tables.h, what serving runs) and from
// the walk over the whole vocabulary they replaced (ConstraintOptions::tables = false), in the same run; the
// bench checks the two masks agree on every state of the answer. cpu_ figures are process CPU time, which a loaded
// machine inflates less. Usage: grammar_mask [TOKENIZER_DIR] [--bounded]   (default:
// tests/fixtures/tokenizers/qwen3-real, .gz files accepted)
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "bench_main.h"
#include "chat/grammar/gbnf.h"
#include "chat/grammar/grammar_constraint.h"
#include "chat/grammar/grammar_matcher.h"
#include "chat/grammar/json_schema.h"
#include "chat/grammar/token_tables.h"
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
double cpu_ms() { return 1e3 * static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

}  // namespace

namespace {

int run(int argc, char** argv) {
  using namespace lathe;
  // --bounded: the same schema with numeric bounds (age 0..150, a score in [0, 1]), enforced by digit-range rules.
  bool bounded = false;
  std::string dir = std::string(LATHE_SOURCE_DIR) + "/tests/fixtures/tokenizers/qwen3-real";
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--bounded")
      bounded = true;
    else
      dir = argv[i];
  }
  auto tok =
      Tokenizer::from_json(read_maybe_gz(dir + "/tokenizer.json"), read_maybe_gz(dir + "/tokenizer_config.json"));
  auto t0 = Clock::now();
  auto trie = grammar::TokenTrie::build(*tok);
  const double trie_ms = ms_since(t0);

  auto schema = nlohmann::ordered_json::parse(R"({"type":"object","properties":{
    "name":{"type":"string"},"age":{"type":"integer"},"email":{"type":"string"},
    "tags":{"type":"array","items":{"type":"string"}},"address":{"type":"object","properties":{
      "street":{"type":"string"},"city":{"type":"string"},"zip":{"type":"string"}},"required":["street","city","zip"]},
    "active":{"type":"boolean"}},"required":["name","age","email","tags","address","active"]})");
  std::string answer =
      R"({"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["math", "engines", "poetry"], )"
      R"("address": {"street": "12 St James's Square", "city": "London", "zip": "SW1Y 4JH"}, "active": true})";
  if (bounded) {
    schema["properties"]["age"] = {{"type", "integer"}, {"minimum", 0}, {"maximum", 150}};
    schema["properties"]["score"] = {{"type", "number"}, {"minimum", 0}, {"maximum", 1}};
    schema["required"].push_back("score");
    answer.insert(answer.size() - 1, R"(, "score": 0.875)");
  }
  t0 = Clock::now();
  auto g = std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(grammar::json_schema_to_gbnf(schema, "s")));
  const double compile_ms = ms_since(t0);
  const std::vector<int32_t> ids = tok->encode(answer);
  const int32_t eos = *tok->token_to_id("<|im_end|>");
  grammar::ConstraintOptions opt{{eos}, {}, -1};
  grammar::ConstraintOptions walk_opt = opt;
  walk_opt.tables = false;

  // Cold: the mask of every state computed from scratch.
  // Tabled: the tables of one fresh TokenTables fill as the answer goes (a schema's first request).
  grammar::StackSet s = grammar::StackSet::start(*g);
  double cold_ms = 0, cold_max = 0, tabled_ms = 0, tabled_max = 0;
  size_t allowed_sum = 0;
  grammar::TokenTables tables(*g, *trie);
  for (int32_t id : ids) {
    t0 = Clock::now();
    const auto mask = grammar::allowed_tokens(*g, *trie, s, opt);
    const double ms = ms_since(t0);
    cold_ms += ms;
    cold_max = std::max(cold_max, ms);
    t0 = Clock::now();
    const auto fast = grammar::allowed_tokens(*g, *trie, s, opt, &tables);
    const double tms = ms_since(t0);
    tabled_ms += tms;
    tabled_max = std::max(tabled_max, tms);
    if (fast != mask) {
      std::fprintf(stderr, "the tabled mask differs from the full walk's\n");
      return 1;
    }
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
  struct Figure {
    double wall_us, cpu_us;
  };
  auto run = [&](const std::shared_ptr<const grammar::GrammarConstraint>& c, bool want_logprob, int passes,
                 float temperature = 0.0f) {
    double total = 0;
    const double cpu0 = cpu_ms();
    for (int p = 0; p < passes; ++p) {
      SamplingParams sp;
      sp.constraint = c;
      sp.temperature = temperature;
      sp.seed = 7;
      Sampler sampler(sp, {eos});
      for (int32_t id : ids) {
        std::vector<float> l = logits;
        l[static_cast<size_t>(id)] = 100.0f;  // the answer's next token wins, so the walk follows the answer
        t0 = Clock::now();
        const SampleResult r = sampler.sample(l, {}, 0, want_logprob);
        total += ms_since(t0);
        if (r.token != id) {
          std::fprintf(stderr, "sampled %d where the answer has %d\n", r.token, id);
          std::exit(1);
        }
      }
    }
    const double steps = passes * static_cast<double>(ids.size());
    return Figure{1e3 * total / steps, 1e3 * (cpu_ms() - cpu0) / steps};
  };
  auto fresh = [&](const grammar::ConstraintOptions& o) {
    return std::make_shared<grammar::GrammarConstraint>(g, trie, o);
  };
  const Figure plain = run(nullptr, true, 3);
  const Figure plain_fast = run(nullptr, false, 3);
  const Figure plain_sampled = run(nullptr, false, 3, 0.8f);
  const auto c = fresh(opt);
  const Figure first = run(c, true, 1);   // the schema's first request: masks computed as decoding goes
  const Figure repeat = run(c, true, 3);  // the same schema again: masks shared by grammar state
  const Figure fast_first = run(fresh(opt), false, 1);
  const Figure fast_repeat = run(c, false, 3);
  const auto cs = fresh(opt);
  const Figure sampled_first = run(cs, false, 1, 0.8f);
  const Figure sampled_repeat = run(cs, false, 3, 0.8f);
  // The same full-mask steps with the vocabulary walk the tables replaced.
  const auto w = fresh(walk_opt);
  const Figure walk_first = run(w, true, 1);
  const Figure walk_repeat = run(w, true, 3);
  const auto ws = fresh(walk_opt);
  const Figure walk_sampled_first = run(ws, false, 1, 0.8f);
  const Figure walk_sampled_repeat = run(ws, false, 3, 0.8f);

  nlohmann::ordered_json out = {{"bench", "grammar_mask"},
                                {"schema", bounded ? "bounded" : "plain"},
                                {"vocab", tok->vocab_size()},
                                {"trie_build_ms", trie_ms},
                                {"schema_compile_ms", compile_ms},
                                {"answer_tokens", ids.size()},
                                {"mask_cold_mean_us", 1e3 * cold_ms / static_cast<double>(ids.size())},
                                {"mask_cold_max_us", 1e3 * cold_max},
                                {"mask_tabled_first_mean_us", 1e3 * tabled_ms / static_cast<double>(ids.size())},
                                {"mask_tabled_first_max_us", 1e3 * tabled_max},
                                {"mean_allowed_tokens", allowed_sum / ids.size()},
                                {"sample_us_plain", plain.wall_us},
                                {"sample_us_plain_no_logprob", plain_fast.wall_us},
                                {"sample_us_first_request", first.wall_us},
                                {"sample_us_repeat_request", repeat.wall_us},
                                {"sample_us_first_request_no_logprob", fast_first.wall_us},
                                {"sample_us_repeat_request_no_logprob", fast_repeat.wall_us},
                                {"overhead_us_per_token_first", first.wall_us - plain.wall_us},
                                {"overhead_us_per_token_repeat", repeat.wall_us - plain.wall_us},
                                {"overhead_us_per_token_first_no_logprob", fast_first.wall_us - plain_fast.wall_us},
                                {"overhead_us_per_token_repeat_no_logprob", fast_repeat.wall_us - plain_fast.wall_us},
                                {"cpu_us_plain_sampled", plain_sampled.cpu_us},
                                {"cpu_us_sampled_first_request", sampled_first.cpu_us},
                                {"cpu_us_sampled_repeat_request", sampled_repeat.cpu_us},
                                {"cpu_us_walk_first_request", walk_first.cpu_us},
                                {"cpu_us_walk_repeat_request", walk_repeat.cpu_us},
                                {"cpu_us_walk_sampled_first_request", walk_sampled_first.cpu_us},
                                {"cpu_us_walk_sampled_repeat_request", walk_sampled_repeat.cpu_us},
                                {"cpu_us_plain", plain.cpu_us},
                                {"cpu_us_plain_no_logprob", plain_fast.cpu_us},
                                {"cpu_us_first_request", first.cpu_us},
                                {"cpu_us_repeat_request", repeat.cpu_us},
                                {"cpu_us_first_request_no_logprob", fast_first.cpu_us},
                                {"cpu_us_repeat_request_no_logprob", fast_repeat.cpu_us}};
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return bench::run_reporting_errors("grammar_mask", [&] { return run(argc, argv); });
}
