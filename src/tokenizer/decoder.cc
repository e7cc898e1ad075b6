#include "tokenizer/decoder.h"

#include "tokenizer/byte_level.h"
#include "tokenizer/pattern.h"
#include "tokenizer/utf8.h"

namespace lathe {
namespace {

const std::string kReplacementChar = "\xEF\xBF\xBD";

// Maps the GPT-2 byte characters back to bytes; a token holding any other character (an added token such as
// "<|im_end|>\n") passes through as its own UTF-8. Bytes that do not form UTF-8 become U+FFFD.
class ByteLevelDecoder : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::string bytes;
    std::string one;
    for (const std::string& t : tokens) {
      one.clear();
      bool mapped = true;
      size_t i = 0;
      while (i < t.size()) {
        const int b = byte_level::byte_for_char(utf8::next(t, i));
        if (b < 0) {
          mapped = false;
          break;
        }
        one.push_back(static_cast<char>(b));
      }
      bytes += mapped ? one : t;
    }
    return {utf8::repair(bytes)};
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    const Pattern rep = Pattern::literal(replacement_);
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = rep.replace_all(tokens[i], " ");
      if (i == 0 && strip_first_ && !tokens[i].empty() && tokens[i][0] == ' ') tokens[i].erase(0, 1);
    }
    return tokens;
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(Pattern pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (auto& t : tokens) t = pattern_.replace_all(t, content_);
    return tokens;
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// "<0xXX>" tokens become raw bytes; a run of them that is not valid UTF-8 becomes one U+FFFD per byte.
class ByteFallbackDecoder : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string run;
    size_t run_len = 0;
    auto flush = [&] {
      if (run_len == 0) return;
      if (utf8::is_valid(run)) {
        out.push_back(run);
      } else {
        for (size_t k = 0; k < run_len; ++k) out.push_back(kReplacementChar);
      }
      run.clear();
      run_len = 0;
    };
    for (auto& t : tokens) {
      int byte = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') byte = parse_hex(t[3], t[4]);
      if (byte >= 0) {
        run.push_back(static_cast<char>(byte));
        ++run_len;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    return out;
  }

 private:
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  static int parse_hex(char hi, char lo) { return hex(hi) < 0 || hex(lo) < 0 ? -1 : hex(hi) * 16 + hex(lo); }
};

class FuseDecoder : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    return {all};
  }
};

// Removes up to `start` leading and `stop` trailing copies of one character from every token.
class StripDecoder : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (auto& t : tokens) {
      size_t b = 0, e = t.size();
      for (size_t n = 0; n < start_ && b < e; ++n) {
        size_t i = b;
        if (utf8::next(t, i) != content_) break;
        b = i;
      }
      for (size_t n = 0; n < stop_ && e > b; ++n) {
        size_t s = 0;
        if (utf8::prev(t, e, s) != content_) break;
        e = s;
      }
      t = t.substr(b, e - b);
    }
    return tokens;
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

// Classic BPE end-of-word suffix: the suffix becomes a space, except on the last token.
class BpeSuffixDecoder : public Decoder {
 public:
  explicit BpeSuffixDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    const Pattern p = Pattern::literal(suffix_);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = p.replace_all(tokens[i], i + 1 == tokens.size() ? "" : " ");
    return tokens;
  }

 private:
  std::string suffix_;
};

class DecoderSequence : public Decoder {
 public:
  explicit DecoderSequence(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (const auto& s : steps_) tokens = s->decode_chain(std::move(tokens));
    return tokens;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

char32_t single_char(const JsonAt& v) {
  const std::string s = v.str();
  size_t i = 0;
  if (s.empty()) v.fail("expected a single character");
  const char32_t c = utf8::next(s, i);
  if (i != s.size()) v.fail("expected a single character");
  return c;
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const JsonAt& spec) {
  if (spec.value().is_null()) return nullptr;
  const std::string type = spec.str("type");
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    const JsonAt rep = spec.at("replacement");
    single_char(rep);
    bool strip_first = spec.boolean_or("add_prefix_space", true);  // legacy spelling
    if (spec.has("prepend_scheme")) strip_first = spec.str("prepend_scheme") != "never";
    return std::make_unique<MetaspaceDecoder>(rep.str(), strip_first);
  }
  if (type == "Replace") return std::make_unique<ReplaceDecoder>(Pattern(spec.at("pattern")), spec.str("content"));
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    const int64_t start = spec.integer_or("start", 0), stop = spec.integer_or("stop", 0);
    if (start < 0 || stop < 0) spec.fail("Strip start/stop must be non-negative");
    return std::make_unique<StripDecoder>(single_char(spec.at("content")), static_cast<size_t>(start),
                                          static_cast<size_t>(stop));
  }
  if (type == "BPEDecoder") return std::make_unique<BpeSuffixDecoder>(spec.str_or("suffix", "</w>"));
  if (type == "Sequence") {
    const JsonAt list = spec.at("decoders");
    std::vector<std::unique_ptr<Decoder>> steps;
    for (size_t i = 0; i < list.size(); ++i)
      if (auto d = make_decoder(list.at(i))) steps.push_back(std::move(d));
    return std::make_unique<DecoderSequence>(std::move(steps));
  }
  spec.at("type").unsupported("unknown decoder type '" + type + "'");
}

}  // namespace lathe
