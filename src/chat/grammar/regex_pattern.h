// A JSON schema's "pattern" (an ECMA-262 regular expression) as GBNF over the JSON text of a string's contents:
// literals, ., classes and \d \w \s, groups, alternation and quantifiers become grammar; what a grammar cannot say
// (lookarounds, backreferences, \b, anchors inside) is refused with the construct named. Without ^ or $ the
// pattern may match anywhere in the string, as JSON Schema says.
#pragma once
#include <string>

namespace lathe::grammar {

// The GBNF expression for every JSON-escaped string body (the text between the quotes) whose decoded value
// matches `pattern`, each character written one way (quotes, backslashes and control characters escaped).
// Throws Error(InvalidArgument) naming what is not supported.
std::string pattern_gbnf(const std::string& pattern);

}  // namespace lathe::grammar
