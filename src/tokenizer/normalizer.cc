#include "tokenizer/normalizer.h"

#include <vector>

#include "tokenizer/pattern.h"
#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

namespace lathe {
namespace {

class UnicodeFormNormalizer : public Normalizer {
 public:
  explicit UnicodeFormNormalizer(unicode::Form form) : form_(form) {}
  std::string normalize(std::string text) const override { return unicode::normalize(text, form_); }
  // ASCII has no decompositions nor compositions in any of the four forms.
  bool leaves_unchanged(std::string_view text) const override {
    for (const char c : text)
      if (static_cast<unsigned char>(c) >= 0x80) return false;
    return true;
  }

 private:
  unicode::Form form_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  std::string normalize(std::string text) const override { return unicode::to_lower(text); }
};

class StripAccentsNormalizer : public Normalizer {
 public:
  std::string normalize(std::string text) const override { return unicode::strip_accents(text); }
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::string normalize(std::string text) const override { return pattern_.replace_all(text, content_); }

 private:
  Pattern pattern_;
  std::string content_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string normalize(std::string text) const override { return text.empty() ? text : prefix_ + text; }

 private:
  std::string prefix_;
};

class AppendNormalizer : public Normalizer {
 public:
  explicit AppendNormalizer(std::string suffix) : suffix_(std::move(suffix)) {}
  std::string normalize(std::string text) const override { return text.empty() ? text : text + suffix_; }

 private:
  std::string suffix_;
};

// Strips Unicode whitespace from the left and/or right end.
class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string normalize(std::string text) const override {
    size_t b = 0, e = text.size();
    if (left_) {
      while (b < e) {
        size_t i = b;
        if (!unicode::is_whitespace(utf8::next(text, i))) break;
        b = i;
      }
    }
    if (right_) {
      while (e > b) {
        size_t start = 0;
        if (!unicode::is_whitespace(utf8::prev(text, e, start))) break;
        e = start;
      }
    }
    return text.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

class NormalizerSequence : public Normalizer {
 public:
  explicit NormalizerSequence(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  std::string normalize(std::string text) const override {
    for (const auto& s : steps_) text = s->normalize(std::move(text));
    return text;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const JsonAt& spec) {
  if (spec.value().is_null()) return nullptr;
  const std::string type = spec.str("type");
  if (type == "NFC") return std::make_unique<UnicodeFormNormalizer>(unicode::Form::NFC);
  if (type == "NFD") return std::make_unique<UnicodeFormNormalizer>(unicode::Form::NFD);
  if (type == "NFKC") return std::make_unique<UnicodeFormNormalizer>(unicode::Form::NFKC);
  if (type == "NFKD") return std::make_unique<UnicodeFormNormalizer>(unicode::Form::NFKD);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "Replace") return std::make_unique<ReplaceNormalizer>(Pattern(spec.at("pattern")), spec.str("content"));
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(spec.str("prepend"));
  if (type == "Append") return std::make_unique<AppendNormalizer>(spec.str("append"));
  if (type == "Strip")
    return std::make_unique<StripNormalizer>(spec.boolean_or("strip_left", true), spec.boolean_or("strip_right", true));
  if (type == "Sequence") {
    const JsonAt list = spec.at("normalizers");
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < list.size(); ++i)
      if (auto n = make_normalizer(list.at(i))) steps.push_back(std::move(n));
    return std::make_unique<NormalizerSequence>(std::move(steps));
  }
  spec.at("type").unsupported("unknown normalizer type '" + type + "'");
}

}  // namespace lathe
