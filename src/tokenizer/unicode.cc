#include "tokenizer/unicode.h"

#include <unicode/bytestream.h>
#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include "common/error.h"
#include "tokenizer/utf8.h"

namespace lathe::unicode {
namespace {

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

const icu::Normalizer2* instance(Form form) {
  UErrorCode st = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
    case Form::NFC: n = icu::Normalizer2::getNFCInstance(st); break;
    case Form::NFD: n = icu::Normalizer2::getNFDInstance(st); break;
    case Form::NFKC: n = icu::Normalizer2::getNFKCInstance(st); break;
    case Form::NFKD: n = icu::Normalizer2::getNFKDInstance(st); break;
  }
  if (U_FAILURE(st) || !n) throw Error(ErrorKind::Internal, std::string("ICU normalizer: ") + u_errorName(st));
  return n;
}

std::string to_utf8(const icu::UnicodeString& u) {
  std::string out;
  u.toUTF8String(out);
  return out;
}

}  // namespace

std::string normalize(std::string_view text, Form form) {
  if (is_ascii(text)) return std::string(text);  // ASCII is invariant under every form
  const icu::Normalizer2* n = instance(form);
  const icu::StringPiece piece(text.data(), static_cast<int32_t>(text.size()));
  UErrorCode st = U_ZERO_ERROR;
  if (n->isNormalizedUTF8(piece, st) && U_SUCCESS(st)) return std::string(text);  // the common case, no copy
  st = U_ZERO_ERROR;
  std::string out;
  icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(text.size()));
  n->normalizeUTF8(0, piece, sink, nullptr, st);
  if (U_FAILURE(st)) throw Error(ErrorKind::Internal, std::string("ICU normalize: ") + u_errorName(st));
  return out;
}

std::string to_lower(std::string_view text) {
  if (is_ascii(text)) {
    std::string out(text);
    for (char& c : out)
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    return out;
  }
  auto u = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  u.toLower(icu::Locale::getRoot());
  return to_utf8(u);
}

std::string strip_accents(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const char32_t c = utf8::next(text, i);
    if (u_charType(static_cast<UChar32>(c)) != U_NON_SPACING_MARK) utf8::append(out, c);
  }
  return out;
}

bool is_whitespace(char32_t c) { return u_isUWhiteSpace(static_cast<UChar32>(c)); }

bool is_punctuation(char32_t c) {
  if (c < 0x80)
    return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') || (c >= '{' && c <= '~');
  return u_ispunct(static_cast<UChar32>(c));
}

bool is_word_char(char32_t c) {
  const auto u = static_cast<UChar32>(c);
  if (u_isalnum(u) || c == '_') return true;
  const int8_t t = u_charType(u);
  return t == U_NON_SPACING_MARK || t == U_COMBINING_SPACING_MARK || t == U_ENCLOSING_MARK ||
         t == U_CONNECTOR_PUNCTUATION;
}

bool is_alnum(char32_t c) { return u_isalnum(static_cast<UChar32>(c)); }

}  // namespace lathe::unicode
