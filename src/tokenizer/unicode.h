// Unicode services the tokenizer needs, backed by ICU: normalization forms, lowercasing, character classes.
#pragma once
#include <string>
#include <string_view>

namespace lathe::unicode {

enum class Form { NFC, NFD, NFKC, NFKD };

std::string normalize(std::string_view text, Form form);
std::string to_lower(std::string_view text);
std::string strip_accents(std::string_view text);  // drops combining marks (general category Mn)

bool is_whitespace(char32_t c);   // Unicode White_Space
bool is_punctuation(char32_t c);  // general category P* or ASCII punctuation
bool is_word_char(char32_t c);    // \w: letters, marks, digits, connector punctuation
bool is_alnum(char32_t c);

}  // namespace lathe::unicode
