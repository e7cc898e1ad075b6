// Sampled decoding (temperature > 0, seeded) under a grammar, where every step builds the full mask: through a few
// schemas over the real Qwen3 vocabulary, the masks from the per-position token tables draw exactly the tokens the
// vocabulary walk draws, and what comes out parses as JSON the grammar accepts.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "chat/grammar/gbnf.h"
#include "chat/grammar/grammar_constraint.h"
#include "chat/grammar/grammar_matcher.h"
#include "chat/grammar/json_schema.h"
#include "engine/sampler.h"
#include "tokenizer_fixtures.h"

namespace lathe::grammar {
namespace {

using ojson = nlohmann::ordered_json;

// Random logits with the tokens that close JSON structures pushed up, so that most runs end within the budget.
std::vector<float> logits_for(std::mt19937& rng, size_t vocab, const std::vector<int32_t>& closers) {
  std::vector<float> l(vocab);
  std::normal_distribution<float> n(0.0f, 2.0f);
  for (float& v : l) v = n(rng);
  for (int32_t id : closers) l[static_cast<size_t>(id)] += 9.0f;
  return l;
}

TEST(GrammarSampled, TablesDrawTheSameTokensAsTheWalkAndTheOutputParses) {
  const Tokenizer& tok = lathe::test::fixture_tokenizer("qwen3-real");
  auto trie = TokenTrie::of(tok);
  const int32_t eos = *tok.token_to_id("<|im_end|>");
  std::vector<int32_t> closers{eos};
  for (const char* s : {"\"", "}", "]", ",", "1", "true", "\"}", "\"]", "null"})
    if (auto id = tok.token_to_id(s)) closers.push_back(*id);
  const char* schemas[] = {
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},"n":{"type":"integer"}},
          "required":["name","n"]})",
      R"({"type":"object","properties":{"tags":{"type":"array","items":{"enum":["a","bc",7]},"maxItems":4},
          "ok":{"type":"boolean"},"v":{"anyOf":[{"type":"number"},{"type":"null"}]}},"required":["tags","ok","v"]})",
      R"({"type":"array","items":{"type":"object","properties":{"k":{"type":"string","maxLength":5}},
          "required":["k"]},"maxItems":3})",
  };
  size_t finished = 0, runs = 0;
  for (const char* text : schemas) {
    auto g = std::make_shared<const Grammar>(parse_gbnf(json_schema_to_gbnf(ojson::parse(text), "s")));
    ConstraintOptions with{{eos}, {}, -1}, walk = with;
    walk.tables = false;
    auto tabled = std::make_shared<GrammarConstraint>(g, trie, with);
    auto walked = std::make_shared<GrammarConstraint>(g, trie, walk);
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      SamplingParams p;
      p.temperature = 1.0f;
      p.seed = seed;
      p.constraint = tabled;
      Sampler a(p);
      p.constraint = walked;
      Sampler b(p);
      std::mt19937 rng(static_cast<uint32_t>(seed));
      std::vector<int32_t> out;
      bool ended = false;
      for (int step = 0; step < 120 && !ended; ++step) {
        const std::vector<float> l = logits_for(rng, tok.vocab_size(), closers);
        const int32_t ta = a.sample(l, out, 0, false).token;
        ASSERT_EQ(ta, b.sample(l, out, 0, false).token) << text << " seed " << seed << " step " << step;
        ended = ta == eos;
        if (!ended) out.push_back(ta);
      }
      ++runs;
      const std::string json = tok.decode(out);
      if (ended) {
        ++finished;
        EXPECT_TRUE(grammar_accepts(*g, json)) << json;
        EXPECT_TRUE(ojson::accept(json)) << json;
      } else {
        StackSet s = StackSet::start(*g);
        for (int32_t id : out)
          for (uint32_t cp : trie->text(id)) s = s.advance(*g, cp);
        EXPECT_FALSE(s.dead()) << json;
      }
    }
  }
  // Most runs must end, or the parse check above tested little.
  EXPECT_GE(finished * 2, runs);
}

}  // namespace
}  // namespace lathe::grammar
