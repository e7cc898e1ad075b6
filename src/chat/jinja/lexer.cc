#include "chat/jinja/lexer.h"

#include <cctype>

#include "common/error.h"

namespace lathe::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

[[noreturn]] void fail(const SourcePos& pos, const std::string& what) {
  throw Error(ErrorKind::InvalidArgument, "template syntax error at " + pos.str() + ": " + what);
}

// Jinja normalises every line ending to "\n" and, unless keep_trailing_newline, drops one trailing newline.
std::string normalize_newlines(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  Lexer(const std::string& source, const LexOptions& options) : src_(normalize_newlines(source)), opt_(options) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      const size_t tag = find_tag(pos_);
      std::string text = src_.substr(pos_, tag == std::string::npos ? std::string::npos : tag - pos_);
      const SourcePos text_pos = pos_at(pos_);
      if (tag == std::string::npos) {
        emit_text(std::move(text), text_pos);
        pos_ = src_.size();
        break;
      }
      const char kind = src_[tag + 1];  // '{', '%' or '#'
      const char modifier = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (modifier == '-') {
        size_t end = text.size();
        while (end > 0 && is_space(text[end - 1])) --end;
        text.resize(end);
      } else if (modifier != '+' && opt_.lstrip_blocks && kind != '{') {
        const size_t line_start = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if (line_start > 0 || line_starting) {
          bool blank = true;
          for (size_t i = line_start; i < text.size(); ++i) blank = blank && (text[i] == ' ' || text[i] == '\t');
          if (blank) text.resize(line_start);
        }
      }
      emit_text(std::move(text), text_pos);
      pos_ = tag + 2 + ((modifier == '-' || modifier == '+') ? 1 : 0);
      char end_modifier = '\0';
      if (kind == '#') {
        end_modifier = lex_comment(tag);
      } else {
        end_modifier = lex_tag(tag, kind == '{');
      }
      const size_t consumed_from = pos_;
      if (end_modifier == '-') {
        while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
      } else if (end_modifier != '+' && kind != '{' && opt_.trim_blocks && pos_ < src_.size() && src_[pos_] == '\n') {
        ++pos_;
      }
      line_starting = pos_ > consumed_from ? src_[pos_ - 1] == '\n' : false;
    }
    tokens_.push_back({Token::Kind::Eof, "", pos_at(src_.size())});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i)
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return std::string::npos;
  }

  SourcePos pos_at(size_t offset) {
    // Incremental: offsets only grow while lexing, so walk forward from the last answer.
    if (offset < line_offset_) {
      line_offset_ = 0;
      line_no_ = 1;
      scan_ = 0;
    }
    for (; scan_ < offset && scan_ < src_.size(); ++scan_) {
      if (src_[scan_] == '\n') {
        ++line_no_;
        line_offset_ = scan_ + 1;
      }
    }
    return {line_no_, static_cast<int>(offset - line_offset_) + 1};
  }

  void emit_text(std::string text, SourcePos pos) {
    if (!text.empty()) tokens_.push_back({Token::Kind::Text, std::move(text), pos});
  }

  char lex_comment(size_t tag) {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) fail(pos_at(tag), "unterminated comment '{#'");
    const char modifier = end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : '\0';
    pos_ = end + 2;
    return modifier;
  }

  // Lexes an expression tag up to its closing delimiter (only at bracket depth 0, like Jinja's balancing).
  char lex_tag(size_t tag, bool is_var) {
    tokens_.push_back({is_var ? Token::Kind::VarBegin : Token::Kind::BlockBegin, "", pos_at(tag)});
    const char* close = is_var ? "}}" : "%}";
    int depth = 0;
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
      if (pos_ >= src_.size())
        fail(pos_at(tag), std::string("unterminated ") + (is_var ? "'{{'" : "'{%'") + ": expected '" + close + "'");
      if (depth == 0) {
        char modifier = '\0';
        size_t at = pos_;
        if ((src_[at] == '-' || (src_[at] == '+' && !is_var)) && src_.compare(at + 1, 2, close) == 0) {
          modifier = src_[at];
          ++at;
        }
        if (src_.compare(at, 2, close) == 0) {
          tokens_.push_back({is_var ? Token::Kind::VarEnd : Token::Kind::BlockEnd, "", pos_at(pos_)});
          pos_ = at + 2;
          return modifier;
        }
      }
      lex_expression_token(depth);
    }
  }

  void lex_expression_token(int& depth) {
    const SourcePos at = pos_at(pos_);
    const char c = src_[pos_];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t end = pos_;
      while (end < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) ++end;
      tokens_.push_back({Token::Kind::Name, src_.substr(pos_, end - pos_), at});
      pos_ = end;
      return;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      lex_number(at);
      return;
    }
    if (c == '\'' || c == '"') {
      lex_string(at);
      return;
    }
    static const char* const kTwoCharOps[] = {"**", "//", "==", "!=", "<=", ">="};
    for (const char* op : kTwoCharOps) {
      if (src_.compare(pos_, 2, op) == 0) {
        tokens_.push_back({Token::Kind::Op, op, at});
        pos_ += 2;
        return;
      }
    }
    static const std::string kOneCharOps = "+-*/%~<>=()[]{},.:|";
    if (kOneCharOps.find(c) == std::string::npos) fail(at, std::string("unexpected character '") + c + "'");
    if (c == '(' || c == '[' || c == '{') ++depth;
    if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
    tokens_.push_back({Token::Kind::Op, std::string(1, c), at});
    ++pos_;
  }

  void lex_number(const SourcePos& at) {
    size_t end = pos_;
    auto digits = [&] {
      while (end < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) ++end;
    };
    digits();
    bool is_float = false;
    if (end + 1 < src_.size() && src_[end] == '.' && std::isdigit(static_cast<unsigned char>(src_[end + 1]))) {
      is_float = true;
      ++end;
      digits();
    }
    if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
      size_t e = end + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      if (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) {
        is_float = true;
        end = e;
        digits();
      }
    }
    std::string text;
    for (size_t i = pos_; i < end; ++i)
      if (src_[i] != '_') text += src_[i];
    tokens_.push_back({is_float ? Token::Kind::Float : Token::Kind::Int, text, at});
    pos_ = end;
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // Python string-literal escapes, which is what Jinja applies to its string literals.
  void lex_string(const SourcePos& at) {
    const char quote = src_[pos_++];
    std::string out;
    while (true) {
      if (pos_ >= src_.size()) fail(at, "unterminated string literal");
      const char c = src_[pos_++];
      if (c == quote) break;
      if (c != '\\' || pos_ >= src_.size()) {
        out += c;
        continue;
      }
      const char e = src_[pos_++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '0': out += '\0'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case '\n': break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t len = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (pos_ + len > src_.size()) fail(at, "truncated \\" + std::string(1, e) + " escape in string literal");
          uint32_t cp = 0;
          for (size_t i = 0; i < len; ++i) {
            const char h = src_[pos_ + i];
            if (!std::isxdigit(static_cast<unsigned char>(h)))
              fail(at, "bad \\" + std::string(1, e) + " escape in string literal");
            cp = cp * 16 + static_cast<uint32_t>(
                               std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : std::tolower(h) - 'a' + 10);
          }
          pos_ += len;
          append_utf8(out, cp);
          break;
        }
        default: out += '\\'; out += e;
      }
    }
    tokens_.push_back({Token::Kind::String, std::move(out), at});
  }

  std::string src_;
  LexOptions opt_;
  size_t pos_ = 0;
  std::vector<Token> tokens_;
  size_t scan_ = 0;
  size_t line_offset_ = 0;
  int line_no_ = 1;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source, const LexOptions& options) {
  return Lexer(source, options).run();
}

}  // namespace lathe::jinja
