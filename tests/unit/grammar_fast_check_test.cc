// The sampler's fast path under a grammar (check only the token greedy picks) against the full mask it skips:
// over the real Qwen3 vocabulary, several grammars and many matcher states reached by random walks, a token
// passes the cheap check exactly when the full mask allows it, the mask from the per-position token tables equals
// the full walk's, and greedy sampling picks the same tokens both ways.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>

#include "chat/grammar/gbnf.h"
#include "chat/grammar/grammar_constraint.h"
#include "chat/grammar/grammar_matcher.h"
#include "chat/grammar/json_schema.h"
#include "chat/grammar/token_tables.h"
#include "engine/logits_processors.h"
#include "engine/sampler.h"
#include "tensor/ops.h"
#include "tokenizer_fixtures.h"

namespace lathe::grammar {
namespace {

using ojson = nlohmann::ordered_json;

struct GrammarFastCheckCase {
  std::string name;
  std::shared_ptr<const Grammar> g;
  ConstraintOptions opt;
};

std::vector<GrammarFastCheckCase> cases(const Tokenizer& tok, const TokenTrie& trie) {
  const int32_t eos = *tok.token_to_id("<|im_end|>");
  auto schema = [](const char* s) {
    return std::make_shared<const Grammar>(parse_gbnf(json_schema_to_gbnf(ojson::parse(s), "s")));
  };
  std::vector<GrammarFastCheckCase> out;
  out.push_back({"nested schema",
                 schema(R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
                   "tags":{"type":"array","items":{"type":"string"}},"address":{"type":"object","properties":{
                   "city":{"type":"string"},"zip":{"type":"string","maxLength":6}},"required":["city"]},
                   "active":{"type":"boolean"}},"required":["name","age","tags","address"]})"),
                 {{eos}, {}, -1}});
  out.push_back({"enums and unions",
                 schema(R"({"type":"object","properties":{"kind":{"enum":["alpha","beta",3,null]},
                   "v":{"anyOf":[{"type":"number"},{"type":"null"}]},"when":{"type":"string","format":"date"}},
                   "required":["kind","v","when"]})"),
                 {{eos}, {}, -1}});
  out.push_back({"json_object", std::make_shared<const Grammar>(parse_gbnf(json_object_gbnf())), {{eos}, {}, -1}});
  out.push_back({"gbnf classes",
                 std::make_shared<const Grammar>(parse_gbnf(R"(root ::= head "\n" (item ",")* item
head ::= "ab" [0-9]+ | [a-z]{2,4} "-" [^\n]*
item ::= "x" | "yz" | [A-Z] [A-Za-z ]*
)")),
                 {{eos}, {}, -1}});
  // A special token the grammar names by its text, and EOS that is allowed only at the end.
  const int32_t call = trie.special_id("<tool_call>");
  GrammarFastCheckCase tools{
      "special tokens",
      std::make_shared<const Grammar>(parse_gbnf(R"(root ::= "<tool_call>" "{\"n\": " [0-9]{1,3} "}")")),
      {{eos}, {}, -1}};
  if (call >= 0) tools.opt.allowed_special.push_back(call);
  out.push_back(tools);
  return out;
}

TEST(GrammarFastCheck, MatchesTheFullMaskOnRandomStates) {
  const Tokenizer& tok = lathe::test::fixture_tokenizer("qwen3-real");
  auto trie = TokenTrie::of(tok);
  const size_t vocab = tok.vocab_size();
  std::mt19937 rng(1234);
  size_t states = 0, checked = 0;
  for (const GrammarFastCheckCase& c : cases(tok, *trie)) {
    TokenTables tables(*c.g, *trie);  // shared by the walks of one grammar, as by the requests of one schema
    for (int walk = 0; walk < 3; ++walk) {
      StackSet s = StackSet::start(*c.g);
      for (int step = 0; step < 12; ++step) {
        const std::vector<char> mask = allowed_tokens(*c.g, *trie, s, c.opt);
        const std::vector<char> tabled = allowed_tokens(*c.g, *trie, s, c.opt, &tables);
        for (size_t i = 0; i < vocab; ++i)
          ASSERT_EQ(mask[i], tabled[i]) << c.name << ": tables differ on token " << i << " \""
                                        << tok.decode(std::vector<int32_t>{static_cast<int32_t>(i)}) << "\" at step "
                                        << step;
        ++states;
        // Every token on some states, a random sample and every allowed one (up to a bound) on the rest.
        std::vector<int32_t> ids;
        std::vector<int32_t> allowed;
        for (size_t i = 0; i < vocab; ++i)
          if (mask[i]) allowed.push_back(static_cast<int32_t>(i));
        if (step % 6 == 0) {
          for (size_t i = 0; i < vocab; ++i) ids.push_back(static_cast<int32_t>(i));
        } else {
          std::uniform_int_distribution<int32_t> any(0, static_cast<int32_t>(vocab) - 1);
          for (int k = 0; k < 3000; ++k) ids.push_back(any(rng));
          std::shuffle(allowed.begin(), allowed.end(), rng);
          ids.insert(ids.end(), allowed.begin(), allowed.begin() + std::min<size_t>(allowed.size(), 3000));
        }
        for (int32_t id : c.opt.eos_ids) ids.push_back(id);
        const bool any_other = std::any_of(allowed.begin(), allowed.end(), [&](int32_t id) {
          return std::find(c.opt.eos_ids.begin(), c.opt.eos_ids.end(), id) == c.opt.eos_ids.end();
        });
        for (int32_t id : ids) {
          const bool is_eos = std::find(c.opt.eos_ids.begin(), c.opt.eos_ids.end(), id) != c.opt.eos_ids.end();
          const bool full = mask[static_cast<size_t>(id)] != 0;
          const bool fast = token_fits(*c.g, *trie, s, c.opt, id);
          if (is_eos) {
            // EOS: the fast check covers the text; the mask adds "complete" and "dead end".
            EXPECT_EQ(full, fast || s.accepting() || !any_other) << c.name << " eos";
          } else {
            ASSERT_EQ(full, fast) << c.name << ": token " << id << " \"" << tok.decode(std::vector<int32_t>{id})
                                  << "\" at step " << step;
          }
          ++checked;
        }
        // Walk on: half the time a one-character token (drives through the structure), else any allowed one.
        std::vector<int32_t> next;
        for (int32_t id : allowed)
          if (std::find(c.opt.eos_ids.begin(), c.opt.eos_ids.end(), id) == c.opt.eos_ids.end()) next.push_back(id);
        if (next.empty()) break;
        std::vector<int32_t> short_ones;
        for (int32_t id : next)
          if (trie->text(id).size() == 1) short_ones.push_back(id);
        const auto& pool = (rng() % 2 == 0 && !short_ones.empty()) ? short_ones : next;
        const int32_t pick = pool[rng() % pool.size()];
        for (uint32_t cp : trie->text(pick)) s = s.advance(*c.g, cp);
        ASSERT_FALSE(s.dead()) << c.name;
      }
    }
  }
  EXPECT_GT(states, 100u);
  RecordProperty("states", static_cast<int>(states));
  RecordProperty("checked", static_cast<int>(checked));
}

TEST(GrammarFastCheck, GreedyPicksTheSameTokensWithAndWithoutTheMask) {
  const Tokenizer& tok = lathe::test::fixture_tokenizer("qwen3-real");
  auto trie = TokenTrie::of(tok);
  const size_t vocab = tok.vocab_size();
  std::mt19937 rng(99);
  size_t fast_steps = 0;
  for (const GrammarFastCheckCase& c : cases(tok, *trie)) {
    auto constraint = std::make_shared<GrammarConstraint>(c.g, trie, c.opt);
    SamplingParams p;
    p.constraint = constraint;
    Sampler with_mask(p, c.opt.eos_ids), checked_only(p, c.opt.eos_ids);
    std::vector<int32_t> out;
    for (int step = 0; step < 40; ++step) {
      // Coarse logits (many exact and near ties) where the top token is often one the grammar rejects.
      std::vector<float> logits(vocab);
      std::uniform_int_distribution<int> level(0, 40);
      for (float& v : logits) v = static_cast<float>(level(rng)) * 0.25f;
      for (int k = 0; k < 8; ++k) {
        const size_t at = rng() % vocab;
        logits[at] = 12.0f + static_cast<float>(rng() % 3) + (rng() % 2 ? 1e-6f : 0.0f);
      }
      const SampleResult a = with_mask.sample(logits, out, 0, true);
      const SampleResult b = checked_only.sample(logits, out, 0, false);
      ASSERT_EQ(a.token, b.token) << c.name << " step " << step;
      fast_steps += b.logprob == 0.0f && a.logprob != 0.0f;  // the fast path leaves the logprob unset
      if (std::find(c.opt.eos_ids.begin(), c.opt.eos_ids.end(), a.token) != c.opt.eos_ids.end()) break;
      out.push_back(a.token);
    }
    // What came out is a prefix the grammar can still complete.
    StackSet s = StackSet::start(*c.g);
    for (int32_t id : out)
      for (uint32_t cp : trie->text(id)) s = s.advance(*c.g, cp);
    EXPECT_FALSE(s.dead()) << c.name << ": " << tok.decode(out);
  }
  EXPECT_GT(fast_steps, 0u);
  // Without a constraint the same holds (the argmax without the log-softmax pass, near ties aside).
  Sampler full(SamplingParams{}), id_only(SamplingParams{});
  for (int step = 0; step < 200; ++step) {
    std::vector<float> logits(64);
    for (float& v : logits) v = static_cast<float>(rng() % 8) * 0.5f + (rng() % 4 == 0 ? 3e-6f : 0.0f);
    ASSERT_EQ(full.sample(logits, {}, 0, true).token, id_only.sample(logits, {}, 0, false).token) << step;
  }
}

// The device sampler's grammar step, run with the CPU ops: a state's allowed-token bits (from the grammar's cache,
// and from the mask() fallback every ConstraintState has) equal its mask, and edits + bitmask + argmax then
// Sampler::take choose and advance exactly as the host Sampler's full-mask greedy step does.
TEST(GrammarFastCheck, DeviceStyleMaskedArgmaxMatchesTheHostSampler) {
  const Tokenizer& tok = lathe::test::fixture_tokenizer("qwen3-real");
  auto trie = TokenTrie::of(tok);
  const size_t vocab = tok.vocab_size() + 7;  // a padded embedding: the extra tokens are never allowed
  std::mt19937 rng(7);
  size_t masked_steps = 0;
  for (const GrammarFastCheckCase& c : cases(tok, *trie)) {
    SamplingParams p;
    p.constraint = std::make_shared<GrammarConstraint>(c.g, trie, c.opt);
    p.logit_bias[static_cast<int32_t>(rng() % 1000)] = -5.0f;
    Sampler host(p, c.opt.eos_ids), device(p, c.opt.eos_ids);
    std::vector<int32_t> out;
    for (int step = 0; step < 30; ++step) {
      std::vector<uint64_t> bits, fallback;
      device.constraint()->allowed_bits(vocab, bits);
      device.constraint()->ConstraintState::allowed_bits(vocab, fallback);
      ASSERT_EQ(bits, fallback) << c.name << " step " << step;
      // Distinct top logits, most often on tokens the grammar rejects.
      std::vector<float> logits(vocab);
      std::uniform_int_distribution<int> level(0, 40);
      for (float& v : logits) v = static_cast<float>(level(rng)) * 0.25f;
      for (int k = 0; k < 8; ++k) logits[rng() % vocab] = 12.0f + 0.5f * static_cast<float>(k);
      const SampleResult want = host.sample(logits, out, 0, true);
      Tensor step_logits = Tensor::from_floats(logits, {1, static_cast<int64_t>(vocab)});
      apply_logit_edits(step_logits, logit_edits(p, out, vocab, 0));
      apply_token_masks(step_logits, {0}, bits);
      const int32_t got = argmax_rows(step_logits)[0];
      ASSERT_EQ(got, want.token) << c.name << " step " << step;
      device.take(got);
      masked_steps += std::any_of(bits.begin(), bits.end(), [](uint64_t w) { return w != ~uint64_t{0}; });
      if (std::find(c.opt.eos_ids.begin(), c.opt.eos_ids.end(), got) != c.opt.eos_ids.end()) break;
      out.push_back(got);
    }
  }
  EXPECT_GT(masked_steps, 20u);
}

}  // namespace
}  // namespace lathe::grammar
