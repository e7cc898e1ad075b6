// User grammars (GBNF, or a JSON schema turned into GBNF) → the matcher and the token masks, over a small
// byte-level vocabulary. Beyond crashes and hangs, a differential check: the mask from the per-position token
// tables (what requests use) must equal the full vocabulary walk, and the sampler's one-token check must agree
// with both, on every state reached by feeding the grammar the input's text.
// Input: byte 0 picks GBNF (even) or JSON schema (odd); the grammar runs to the first NUL, the text after it.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/grammar/gbnf.h"
#include "chat/grammar/grammar_constraint.h"
#include "chat/grammar/grammar_matcher.h"
#include "chat/grammar/json_schema.h"
#include "chat/grammar/token_tables.h"
#include "chat/grammar/token_trie.h"
#include "common/error.h"
#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

namespace {

// GPT-2's byte → printable code point map (tokenizer.json's byte-level alphabet).
std::string byte_symbol(unsigned b) {
  unsigned cp = b;
  if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174))) {
    unsigned n = 0;
    for (unsigned x = 0; x < b; ++x)
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174))) ++n;
    cp = 256 + n;
  }
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

// Every byte, then JSON-ish words built by merges (so tokens span structure: `{"`, `":`, `true`, `, "`), and
// an EOS: a vocabulary small enough for a full walk per state, with multi-byte and partial-UTF-8 tokens.
const lathe::Tokenizer& tokenizer() {
  static const std::unique_ptr<lathe::Tokenizer> tok = [] {
    nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
    nlohmann::ordered_json merges = nlohmann::ordered_json::array();
    int next = 0;
    for (unsigned b = 0; b < 256; ++b) vocab[byte_symbol(b)] = next++;
    for (const char* word : {"{\"", "\":", "\": ", ", \"", "true", "false", "null", "\"}", "},", "[]", "ab", "abc",
                             "12", "123", "\\n", "  ", "é"}) {
      std::string have;
      for (unsigned char c : std::string(word)) {
        const std::string sym = byte_symbol(c);
        if (!have.empty()) {
          const std::string merged = have + sym;
          if (!vocab.contains(merged)) {
            merges.push_back(have + " " + sym);
            vocab[merged] = next++;
          }
        }
        have += sym;
      }
    }
    const int eos = next++;
    nlohmann::ordered_json j = {
        {"version", "1.0"},
        {"added_tokens",
         {{{"id", eos},
           {"content", "<|end|>"},
           {"single_word", false},
           {"lstrip", false},
           {"rstrip", false},
           {"normalized", false},
           {"special", true}}}},
        {"normalizer", nullptr},
        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
        {"decoder", {{"type", "ByteLevel"}}},
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
    return lathe::Tokenizer::from_json(j.dump());
  }();
  return *tok;
}

[[noreturn]] void finding(const char* what, size_t token, size_t step) {
  std::fprintf(stderr, "grammar_fuzz: %s (token %zu, step %zu)\n", what, token, step);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lathe::grammar;
  if (size < 1) return 0;
  static const std::shared_ptr<const TokenTrie> trie = TokenTrie::build(tokenizer());
  const std::string rest = lathe::fuzz::text(data + 1, size - 1);
  const size_t nul = rest.find('\0');
  const std::string spec = rest.substr(0, nul);
  const std::string text = nul == std::string::npos ? std::string() : rest.substr(nul + 1);
  LATHE_FUZZ_EXPECTED_ERRORS({
    std::string gbnf = spec;
    if (data[0] % 2 == 1) {
      const auto schema = nlohmann::ordered_json::parse(spec, nullptr, false);
      if (schema.is_discarded() || !(schema.is_object() || schema.is_boolean())) return 0;
      gbnf = json_schema_to_gbnf(schema, "schema");
    }
    const Grammar g = parse_gbnf(gbnf);
    (void)grammar_accepts(g, text);

    const size_t vocab = tokenizer().vocab_size();
    const int32_t eos = static_cast<int32_t>(vocab) - 1;
    ConstraintOptions opt;
    opt.eos_ids = {eos};
    TokenTables tables(g, *trie);
    std::vector<uint32_t> cps;
    if (!utf8_to_code_points(text, cps)) cps.clear();
    StackSet s = StackSet::start(g);
    // The start state, then one state per code point of the text while the grammar takes it (64 at most).
    for (size_t step = 0; step <= cps.size() && step <= 64; ++step) {
      const std::vector<char> full = allowed_tokens(g, *trie, s, opt);
      const std::vector<char> tabled = allowed_tokens(g, *trie, s, opt, &tables);
      for (size_t i = 0; i < vocab; ++i) {
        if (full[i] != tabled[i]) finding("the tables' mask differs from the full walk", i, step);
        if (static_cast<int32_t>(i) != eos && (full[i] != 0) != token_fits(g, *trie, s, opt, static_cast<int32_t>(i)))
          finding("token_fits disagrees with the mask", i, step);
      }
      if (step == cps.size() || step == 64) break;
      s = s.advance(g, cps[step]);
      if (s.dead()) break;
    }
  });
  return 0;
}
