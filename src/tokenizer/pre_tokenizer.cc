#include "tokenizer/pre_tokenizer.h"

#include <functional>
#include <optional>

#include "tokenizer/byte_level.h"
#include "tokenizer/pattern.h"
#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

namespace lathe {
namespace {

// GPT-2's word regex, used by ByteLevel when use_regex is set.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Applies `fn` to every piece and splices its output in place of the piece.
void for_each_piece(std::vector<std::string>& pieces,
                    const std::function<std::vector<std::string>(std::string&, size_t)>& fn) {
  std::vector<std::string> out;
  out.reserve(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i)
    for (auto& p : fn(pieces[i], i)) out.push_back(std::move(p));
  pieces = std::move(out);
}

// Every character satisfying `pred` is a match of its own.
std::vector<Span> char_spans(std::string_view text, const std::function<bool(char32_t)>& pred) {
  std::vector<Span> out;
  if (text.empty()) return {{0, 0, false}};
  size_t prev = 0, i = 0;
  while (i < text.size()) {
    const size_t b = i;
    if (pred(utf8::next(text, i))) {
      if (prev != b) out.push_back({prev, b, false});
      out.push_back({b, i, true});
      prev = i;
    }
  }
  if (prev != text.size()) out.push_back({prev, text.size(), false});
  return out;
}

class Split : public PreTokenizer {
 public:
  Split(Pattern pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void split(std::vector<std::string>& pieces, bool) const override {
    for_each_piece(pieces, [&](std::string& p, size_t) {
      std::vector<Span> spans = pattern_.spans(p);
      if (invert_)
        for (Span& s : spans) s.is_match = !s.is_match;
      return split_spans(p, std::move(spans), behavior_);
    });
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

class CharClassSplit : public PreTokenizer {
 public:
  CharClassSplit(std::function<bool(char32_t)> pred, SplitBehavior behavior)
      : pred_(std::move(pred)), behavior_(behavior) {}
  void split(std::vector<std::string>& pieces, bool) const override {
    for_each_piece(pieces, [&](std::string& p, size_t) { return split_spans(p, char_spans(p, pred_), behavior_); });
  }

 private:
  std::function<bool(char32_t)> pred_;
  SplitBehavior behavior_;
};

class ByteLevel : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space) {
    if (use_regex) regex_ = Pattern::regex(kGpt2Pattern, "ByteLevel regex");
  }
  void split(std::vector<std::string>& pieces, bool) const override {
    for_each_piece(pieces, [&](std::string& p, size_t) {
      if (add_prefix_space_ && (p.empty() || p[0] != ' ')) p.insert(p.begin(), ' ');
      std::vector<std::string> words;
      if (regex_)
        words = split_spans(p, regex_->spans(p), SplitBehavior::Isolated);
      else if (!p.empty())
        words.push_back(std::move(p));
      for (auto& w : words) w = byte_level::encode(w);
      return words;
    });
  }

 private:
  bool add_prefix_space_;
  std::optional<Pattern> regex_;
};

enum class PrependScheme { Always, Never, First };

class Metaspace : public PreTokenizer {
 public:
  Metaspace(std::string replacement, PrependScheme scheme, bool split_words)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split_words) {}
  void split(std::vector<std::string>& pieces, bool at_text_start) const override {
    const Pattern space = Pattern::literal(" ");
    const Pattern rep = Pattern::literal(replacement_);
    for_each_piece(pieces, [&](std::string& p, size_t index) {
      std::string s = space.replace_all(p, replacement_);
      const bool starts = s.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts &&
          (scheme_ == PrependScheme::Always || (scheme_ == PrependScheme::First && index == 0 && at_text_start)))
        s = replacement_ + s;
      if (!split_) return s.empty() ? std::vector<std::string>{} : std::vector<std::string>{s};
      return split_spans(s, rep.spans(s), SplitBehavior::MergedWithNext);
    });
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

class Sequence : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void split(std::vector<std::string>& pieces, bool at_text_start) const override {
    for (const auto& s : steps_) s->split(pieces, at_text_start);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

bool is_ascii_digit(char32_t c) { return c >= '0' && c <= '9'; }

PrependScheme parse_prepend_scheme(const JsonAt& spec) {
  if (spec.has("prepend_scheme")) {
    const JsonAt v = spec.at("prepend_scheme");
    const std::string s = v.str();
    if (s == "always") return PrependScheme::Always;
    if (s == "never") return PrependScheme::Never;
    if (s == "first") return PrependScheme::First;
    v.fail("unknown prepend_scheme '" + s + "'");
  }
  return spec.boolean_or("add_prefix_space", true) ? PrependScheme::Always : PrependScheme::Never;  // legacy form
}

std::string metaspace_replacement(const JsonAt& spec) {
  const JsonAt v = spec.at("replacement");
  const std::string r = v.str();
  size_t i = 0;
  if (r.empty() || (utf8::next(r, i), i != r.size())) v.fail("replacement must be a single character");
  return r;
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const JsonAt& spec) {
  if (spec.value().is_null()) return nullptr;
  const std::string type = spec.str("type");
  if (type == "Split")
    return std::make_unique<Split>(Pattern(spec.at("pattern")), parse_split_behavior(spec.at("behavior")),
                                   spec.boolean_or("invert", false));
  if (type == "ByteLevel")
    return std::make_unique<ByteLevel>(spec.boolean_or("add_prefix_space", true), spec.boolean_or("use_regex", true));
  if (type == "Metaspace")
    return std::make_unique<Metaspace>(metaspace_replacement(spec), parse_prepend_scheme(spec),
                                       spec.boolean_or("split", true));
  if (type == "Digits")
    return std::make_unique<CharClassSplit>(is_ascii_digit, spec.boolean_or("individual_digits", false)
                                                                ? SplitBehavior::Isolated
                                                                : SplitBehavior::Contiguous);
  if (type == "Punctuation") {
    const SplitBehavior b = spec.has("behavior") ? parse_split_behavior(spec.at("behavior")) : SplitBehavior::Isolated;
    return std::make_unique<CharClassSplit>(unicode::is_punctuation, b);
  }
  if (type == "Whitespace")  // keeps runs of word characters and runs of other non-space characters
    return std::make_unique<Split>(Pattern::regex(R"(\w+|[^\w\s]+)", "Whitespace regex"), SplitBehavior::Removed, true);
  if (type == "WhitespaceSplit")
    return std::make_unique<CharClassSplit>(unicode::is_whitespace, SplitBehavior::Removed);
  if (type == "BertPreTokenizer") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    steps.push_back(std::make_unique<CharClassSplit>(unicode::is_whitespace, SplitBehavior::Removed));
    steps.push_back(std::make_unique<CharClassSplit>(unicode::is_punctuation, SplitBehavior::Isolated));
    return std::make_unique<Sequence>(std::move(steps));
  }
  if (type == "Sequence") {
    const JsonAt list = spec.at("pretokenizers");
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < list.size(); ++i)
      if (auto p = make_pre_tokenizer(list.at(i))) steps.push_back(std::move(p));
    return std::make_unique<Sequence>(std::move(steps));
  }
  spec.at("type").unsupported("unknown pre-tokenizer type '" + type + "'");
}

}  // namespace lathe
