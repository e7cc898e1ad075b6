// UTF-8 helpers shared by the tokenizer stages: code point iteration, encoding, and lossy repair.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace lathe::utf8 {

// Length of the UTF-8 sequence that starts with `lead` (1 for stray continuation or invalid bytes).
inline size_t seq_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

// Decodes the code point at s[i] (s is valid UTF-8) and advances i past it.
char32_t next(std::string_view s, size_t& i);

// Decodes the last code point that ends at `end` (exclusive); returns its start in `start`.
char32_t prev(std::string_view s, size_t end, size_t& start);

void append(std::string& out, char32_t cp);
std::string encode(char32_t cp);

// Replaces every invalid or truncated sequence by U+FFFD, one per maximal invalid subpart, as Rust's
// String::from_utf8_lossy does (the reference decoders are written in Rust).
std::string repair(std::string_view bytes);
bool is_valid(std::string_view bytes);

}  // namespace lathe::utf8
