#include "tokenizer/byte_level.h"

#include "tokenizer/utf8.h"

namespace lathe::byte_level {
namespace {

struct Tables {
  std::array<std::string, 256> chars;
  std::array<int16_t, 512> bytes;  // indexed by code point; every mapped code point is < 512

  Tables() {
    bytes.fill(-1);
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp = printable(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
      chars[b] = utf8::encode(cp);
      bytes[cp] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

const std::string& char_for_byte(uint8_t b) { return tables().chars[b]; }

int byte_for_char(char32_t c) { return c < 512 ? tables().bytes[c] : -1; }

std::string encode(std::string_view text) {
  const Tables& t = tables();
  std::string out;
  out.reserve(text.size() * 2);
  for (char c : text) out += t.chars[static_cast<uint8_t>(c)];
  return out;
}

}  // namespace lathe::byte_level
