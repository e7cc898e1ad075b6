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

void encode_into(std::string_view text, std::string& out) {
  const Tables& t = tables();
  out.resize(text.size() * 2);  // every character takes one or two UTF-8 bytes
  char* p = out.data();
  for (char c : text) {
    const std::string& ch = t.chars[static_cast<uint8_t>(c)];
    p[0] = ch[0];
    if (ch.size() == 2) p[1] = ch[1];
    p += ch.size();
  }
  out.resize(static_cast<size_t>(p - out.data()));
}

}  // namespace lathe::byte_level
