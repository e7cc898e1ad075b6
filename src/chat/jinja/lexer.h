// Splits a template into text and tag tokens, applying Jinja2's whitespace control ({%- -%}, trim_blocks,
// lstrip_blocks, the dropped trailing newline) so that the parser only ever sees the text that is output.
#pragma once
#include <string>
#include <vector>

namespace lathe::jinja {

struct SourcePos {
  int line = 1;
  int col = 1;
  std::string str() const { return std::to_string(line) + ":" + std::to_string(col); }
};

struct Token {
  enum class Kind { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };
  Kind kind;
  std::string text;  // raw text, name, unescaped string, number literal or operator
  SourcePos pos;
};

struct LexOptions {
  bool trim_blocks = true;    // drop the first newline after a block or comment tag (transformers' setting)
  bool lstrip_blocks = true;  // drop spaces/tabs before a block or comment tag that starts a line
};

// Throws Error(InvalidArgument) naming the construct and line:col for unterminated tags, strings and
// unknown characters.
std::vector<Token> tokenize(const std::string& source, const LexOptions& options = {});

}  // namespace lathe::jinja
