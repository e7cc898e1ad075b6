// GPT-2's byte <-> printable-character table used by the ByteLevel pre-tokenizer and decoder.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace lathe::byte_level {

// The UTF-8 text of the character that stands for byte b.
const std::string& char_for_byte(uint8_t b);

// The byte a character stands for, or -1 when the character is not in the table.
int byte_for_char(char32_t c);

// Maps every byte of `text` to its character, replacing the contents of `out` (reused to avoid allocation).
void encode_into(std::string_view text, std::string& out);

}  // namespace lathe::byte_level
