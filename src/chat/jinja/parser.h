// Recursive-descent parser from tokens to the statement tree, following Jinja2's operator precedence.
#pragma once
#include <vector>

#include "chat/jinja/ast.h"
#include "chat/jinja/lexer.h"

namespace lathe::jinja {

// Throws Error(InvalidArgument) "template syntax error at LINE:COL: ..." naming the construct at fault.
Body parse(const std::vector<Token>& tokens);

}  // namespace lathe::jinja
