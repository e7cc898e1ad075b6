#include "tokenizer/stream_decoder.h"

#include <span>

#include "tokenizer/utf8.h"

namespace lathe {
namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

bool ends_with_replacement(const std::string& s) {
  return s.size() >= kReplacementChar.size() &&
         s.compare(s.size() - kReplacementChar.size(), kReplacementChar.size(), kReplacementChar) == 0;
}

// Length of the common prefix of a and b, cut back to a character boundary of b.
size_t common_prefix(const std::string& a, const std::string& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  while (n > 0 && n < b.size() && (static_cast<unsigned char>(b[n]) & 0xC0) == 0x80) --n;
  return n;
}

}  // namespace

std::string StreamDecoder::push(int32_t id) {
  ids_.push_back(id);
  return emit(false);
}

std::string StreamDecoder::finish() {
  std::string rest = emit(true);
  reset();
  return rest;
}

void StreamDecoder::reset() {
  ids_.clear();
  prefix_ = read_ = 0;
}

std::string StreamDecoder::emit(bool final) {
  const std::span<const int32_t> all(ids_);
  const std::string before = tokenizer_->decode(all.subspan(prefix_, read_ - prefix_), skip_special_);
  const std::string now = tokenizer_->decode(all.subspan(prefix_), skip_special_);
  if (now.size() <= before.size() || (!final && ends_with_replacement(now))) return {};
  std::string out = now.substr(common_prefix(before, now));
  prefix_ = read_;
  read_ = ids_.size();
  return out;
}

}  // namespace lathe
