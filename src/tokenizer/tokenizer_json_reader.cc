#include "tokenizer/tokenizer_json_reader.h"

#include "common/error.h"
#include "common/limits.h"
#include "io/json_guard.h"

namespace lathe {
namespace {

using json = nlohmann::json;

// A SAX consumer: forwards events to nlohmann's tree builder, except inside model.vocab / model.merges.
class Reader {
 public:
  explicit Reader(TokenizerJson& out) : out_(out), dom_(out.doc, true) {}

  bool null() {
    return scalar([&] { return dom_.null(); }, false);
  }
  bool boolean(bool v) {
    return scalar([&] { return dom_.boolean(v); }, false);
  }
  bool number_integer(json::number_integer_t v) {
    if (mode_ == Mode::Vocab && depth_ == 0) return vocab_id(v);
    return scalar([&] { return dom_.number_integer(v); }, false);
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (mode_ == Mode::Vocab && depth_ == 0)
      return vocab_id(v > static_cast<json::number_unsigned_t>(INT64_MAX) ? -1 : static_cast<int64_t>(v));
    return scalar([&] { return dom_.number_unsigned(v); }, false);
  }
  bool number_float(json::number_float_t v, const std::string& s) {
    return scalar([&] { return dom_.number_float(v, s); }, false);
  }
  bool binary(json::binary_t& v) {
    return scalar([&] { return dom_.binary(v); }, false);
  }
  bool string(std::string& v) {
    if (mode_ == Mode::Merges) {
      if (depth_ == 0) return merge_string(v);
      if (depth_ == 1)
        pair_.push_back(std::move(v));
      else
        pair_ok_ = false;
      return true;
    }
    return scalar([&] { return dom_.string(v); }, true);
  }

  bool key(std::string& k) {
    if (mode_ != Mode::None) {
      if (mode_ == Mode::Vocab && depth_ == 0) pending_key_ = std::move(k);
      return true;
    }
    if (!frames_.empty()) frames_.back().key = k;
    return dom_.key(k);
  }

  bool start_object(std::size_t n) {
    if (mode_ != Mode::None) return nested_start();
    if (capture("vocab", Mode::Vocab, out_.tables.vocab_captured)) return dom_.start_object(0);
    frames_.push_back({true, {}});
    return dom_.start_object(n);
  }
  bool end_object() {
    if (mode_ != Mode::None) return nested_end(true);
    frames_.pop_back();
    return dom_.end_object();
  }
  bool start_array(std::size_t n) {
    if (mode_ == Mode::Merges && depth_ == 0) {
      depth_ = 1;
      pair_.clear();
      pair_ok_ = true;
      return true;
    }
    if (mode_ != Mode::None) return nested_start();
    if (capture("merges", Mode::Merges, out_.tables.merges_captured)) return dom_.start_array(0);
    frames_.push_back({false, {}});
    return dom_.start_array(n);
  }
  bool end_array() {
    if (mode_ == Mode::Merges && depth_ == 1) {
      depth_ = 0;
      if (pair_ok_ && pair_.size() == 2)
        out_.tables.merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      else
        fail(merge_path(), "a merge must be \"a b\" or [\"a\", \"b\"]");
      ++merge_index_;
      return true;
    }
    if (mode_ != Mode::None) return nested_end(false);
    frames_.pop_back();
    return dom_.end_array();
  }

  // A template so the concrete exception type (parse_error, with its byte offset) survives the rethrow.
  template <typename Exception>
  bool parse_error(std::size_t pos, const std::string& token, const Exception& e) {
    return dom_.parse_error(pos, token, e);
  }

 private:
  enum class Mode { None, Vocab, Merges };
  struct Frame {
    bool object;
    std::string key;
  };

  // The next value is root.model.<name>.
  bool at_model_member(const char* name) const {
    return frames_.size() == 2 && frames_[0].object && frames_[0].key == "model" && frames_[1].object &&
           frames_[1].key == name;
  }
  // Entering model.<member>: its entries go to the tables (mode) instead of the DOM, which gets an empty value.
  bool capture(const char* member, Mode mode, bool& captured) {
    if (!at_model_member(member)) return false;
    mode_ = mode;
    captured = true;
    return true;
  }

  template <typename F>
  bool scalar(F forward, bool is_string) {
    if (mode_ == Mode::None) return forward();
    if (mode_ == Mode::Vocab && depth_ == 0)
      fail("model.vocab[\"" + pending_key_ + "\"]", "a token id must be a non-negative integer");
    if (mode_ == Mode::Merges) {
      if (depth_ == 0) {
        fail(merge_path(), "a merge must be \"a b\" or [\"a\", \"b\"]");
        ++merge_index_;
      } else if (!is_string) {
        pair_ok_ = false;
      }
    }
    return true;
  }

  bool vocab_id(int64_t v) {
    // Ids index dense tables, so a huge one would be a huge allocation: bounded well above real vocabularies.
    if (v < 0 || v > limits::kTokenizerMaxId)
      fail("model.vocab[\"" + pending_key_ + "\"]",
           "a token id must be an integer from 0 to " + std::to_string(limits::kTokenizerMaxId));
    else
      out_.tables.vocab.emplace_back(std::move(pending_key_), v);
    return true;
  }

  bool merge_string(std::string& s) {
    const size_t sp = s.find(' ');
    if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
      fail(merge_path(), "a merge string must hold two tokens separated by one space");
    else
      out_.tables.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    ++merge_index_;
    return true;
  }

  // Containers nested where a token id or merge token should be: malformed, skipped.
  bool nested_start() {
    if (mode_ == Mode::Vocab && depth_ == 0)
      fail("model.vocab[\"" + pending_key_ + "\"]", "a token id must be a non-negative integer");
    if (mode_ == Mode::Merges) {
      if (depth_ == 0) fail(merge_path(), "a merge must be \"a b\" or [\"a\", \"b\"]");
      pair_ok_ = false;
    }
    ++depth_;
    return true;
  }
  bool nested_end(bool object) {
    if (depth_ > 0) {
      --depth_;
      if (mode_ == Mode::Merges && depth_ == 0) ++merge_index_;
      return true;
    }
    mode_ = Mode::None;  // the lifted member closes; the tree keeps it as an empty container
    return object ? dom_.end_object() : dom_.end_array();
  }

  std::string merge_path() const { return "model.merges[" + std::to_string(merge_index_) + "]"; }
  void fail(const std::string& path, const std::string& what) {
    if (!out_.tables.error.empty()) return;
    out_.tables.error_path = path;
    out_.tables.error = what;
  }

  TokenizerJson& out_;
  nlohmann::detail::json_sax_dom_parser<json> dom_;
  std::vector<Frame> frames_;
  Mode mode_ = Mode::None;
  int depth_ = 0;
  std::string pending_key_;
  std::vector<std::string> pair_;
  bool pair_ok_ = true;
  size_t merge_index_ = 0;
};

}  // namespace

TokenizerJson parse_tokenizer_json(std::string_view text) {
  TokenizerJson out;
  if (auto err = io::check_json_limits(text, io::file_json_limits()))
    throw Error(ErrorKind::Corrupt, "tokenizer.json: " + *err);
  Reader reader(out);
  try {
    json::sax_parse(text.begin(), text.end(), &reader);
  } catch (const json::parse_error& e) {
    throw Error(ErrorKind::Corrupt,
                "tokenizer.json: JSON syntax error at byte " + std::to_string(e.byte) + ": " + e.what());
  } catch (const json::out_of_range& e) {  // a number too large for a double (1e999)
    throw Error(ErrorKind::Corrupt, std::string("tokenizer.json: ") + e.what());
  }
  return out;
}

}  // namespace lathe
