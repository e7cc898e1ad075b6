// GBNF (llama.cpp's grammar notation) → Grammar. Supported: `name ::= …` rules, "literals", [classes] with
// ranges and ^, `.`, (groups), |, and the postfixes * + ? {m} {m,} {m,n}; # comments; escapes \n \r \t \\ \"
// \[ \] \- \xHH \uHHHH \UHHHHHHHH. The start rule is `root`. Errors (syntax, undefined rules, left recursion,
// limits) throw Error(InvalidArgument) with the line and what was wrong.
#pragma once
#include <string_view>

#include "chat/grammar/grammar.h"

namespace lathe::grammar {

struct GbnfLimits {
  size_t max_bytes = 256 * 1024;
  size_t max_elements = 1 << 20;
  size_t max_rules = 1 << 16;
  int max_nesting = 64;
  int max_repeat = 1000;  // largest m or n in {m,n}
};

Grammar parse_gbnf(std::string_view text, const GbnfLimits& limits = {});

}  // namespace lathe::grammar
