#include "chat/grammar/regex_pattern.h"

#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

#include "common/error.h"

namespace lathe::grammar {
// Named, not anonymous: a unity batch joins this file with others whose anonymous namespaces hold helpers of
// the same names.
namespace regex_pattern_detail {

using Range = std::pair<uint32_t, uint32_t>;

struct CharSet {
  bool negated = false;
  std::vector<Range> ranges;
  bool has(uint32_t cp) const {
    for (const auto& [a, b] : ranges)
      if (cp >= a && cp <= b) return true;
    return false;
  }
};

constexpr int kMaxRepeat = 1000;  // the GBNF parser's repetition cap
constexpr int kMaxNesting = 64;

[[noreturn]] void unsupported(const std::string& what) {
  throw Error(ErrorKind::InvalidArgument, "pattern: " + what + " is not supported");
}

// A code point as a GBNF escape (valid inside a literal and a class alike).
std::string esc(uint32_t cp) {
  char buf[16];
  if (cp < 0x100)
    std::snprintf(buf, sizeof buf, "\\x%02X", cp);
  else if (cp < 0x10000)
    std::snprintf(buf, sizeof buf, "\\u%04X", cp);
  else
    std::snprintf(buf, sizeof buf, "\\U%08X", cp);
  return buf;
}

// Characters a JSON string cannot hold raw: the quote, the backslash and the controls.
bool needs_escape(uint32_t cp) { return cp == '"' || cp == '\\' || cp < 0x20; }

// The JSON text of one such character, as a GBNF literal.
std::string escaped_literal(uint32_t cp) {
  switch (cp) {
    case '"': return R"("\\\"")";
    case '\\': return R"("\\\\")";
    case '\b': return R"("\\b")";
    case '\f': return R"("\\f")";
    case '\n': return R"("\\n")";
    case '\r': return R"("\\r")";
    case '\t': return R"("\\t")";
    default: {
      char buf[16];
      std::snprintf(buf, sizeof buf, "\\\\u%04x", cp);
      return std::string("\"") + buf + "\"";
    }
  }
}

std::string literal(uint32_t cp) { return needs_escape(cp) ? escaped_literal(cp) : "\"" + esc(cp) + "\""; }

std::string alternatives(const std::vector<std::string>& alts) {
  if (alts.size() == 1) return alts[0];
  std::string out;
  for (const std::string& a : alts) out += (out.empty() ? "( " : " | ") + a;
  return out + " )";
}

std::string class_gbnf(const CharSet& s) {
  std::vector<std::string> alts;
  if (!s.negated) {
    std::string raw;
    for (auto [a, b] : s.ranges) {
      // The raw part skips what must be escaped: controls, the quote, the backslash.
      std::vector<Range> pieces;
      uint32_t from = std::max<uint32_t>(a, 0x20);
      for (uint32_t cut : {uint32_t{'"'}, uint32_t{'\\'}}) {
        if (from > b) break;
        if (cut >= from && cut <= b) {
          if (cut > from) pieces.push_back({from, cut - 1});
          from = cut + 1;
        }
      }
      if (from <= b) pieces.push_back({from, b});
      for (auto [x, y] : pieces) raw += x == y ? esc(x) : esc(x) + "-" + esc(y);
    }
    if (!raw.empty()) alts.push_back("[" + raw + "]");
    for (uint32_t cp = 0; cp < 0x20; ++cp)
      if (s.has(cp)) alts.push_back(escaped_literal(cp));
    for (uint32_t cp : {uint32_t{'"'}, uint32_t{'\\'}})
      if (s.has(cp)) alts.push_back(escaped_literal(cp));
  } else {
    std::string raw = "[^";
    for (auto [a, b] : s.ranges) raw += a == b ? esc(a) : esc(a) + "-" + esc(b);
    raw += esc('"') + esc('\\') + esc(0) + "-" + esc(0x1F) + "]";
    alts.push_back(raw);
    // Escaped members: the quote, the backslash and the common controls (the rest are not generated).
    for (uint32_t cp : {uint32_t{'"'}, uint32_t{'\\'}, uint32_t{'\t'}, uint32_t{'\n'}, uint32_t{'\r'}})
      if (!s.has(cp)) alts.push_back(escaped_literal(cp));
  }
  if (alts.empty()) unsupported("an empty character class");
  return alternatives(alts);
}

CharSet shorthand(char c) {
  CharSet s;
  switch (c) {
    case 'd':
    case 'D': s.ranges = {{'0', '9'}}; break;
    case 'w':
    case 'W': s.ranges = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; break;
    default:  // s, S: ECMA-262 white space and line terminators
      s.ranges = {{0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
                  {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
  }
  s.negated = c == 'D' || c == 'W' || c == 'S';
  return s;
}

class PatternParser {
 public:
  explicit PatternParser(const std::string& text) {
    for (size_t i = 0; i < text.size();) {  // UTF-8 → code points (the schema came from parsed JSON: valid)
      const unsigned char c = static_cast<unsigned char>(text[i]);
      const int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
      uint32_t cp = len == 1 ? c : c & (0x7F >> len);
      for (int k = 1; k < len && i + k < text.size(); ++k) cp = (cp << 6) | (text[i + k] & 0x3F);
      cps_.push_back(cp);
      i += len;
    }
  }

  std::string top() {
    // Anchors at the ends of each top-level alternative; elsewhere they are refused.
    std::vector<std::string> alts;
    do {
      const bool start = eat('^');
      std::string body = sequence(0, true);
      const bool end = eat('$');
      std::string expr = body.empty() ? "" : body;
      if (!start) expr = expr.empty() ? "json-char*" : "json-char* " + expr;
      if (!end) expr = expr.empty() ? "json-char*" : expr + " json-char*";
      alts.push_back(expr.empty() ? "\"\"" : expr);
    } while (eat('|'));
    if (pos_ < cps_.size()) unsupported(cps_[pos_] == ')' ? "an unmatched ')'" : "'^' or '$' inside the pattern");
    return alternatives(alts);
  }

 private:
  std::vector<uint32_t> cps_;
  size_t pos_ = 0;
  // Whether the expression just returned can match the empty string: a grammar cannot repeat one that can (its
  // repetition would recurse without reading), so (a*)* is refused where a* would be written.
  bool nullable_ = false;

  bool at_end() const { return pos_ >= cps_.size(); }
  uint32_t peek(size_t ahead = 0) const { return pos_ + ahead < cps_.size() ? cps_[pos_ + ahead] : 0; }
  bool eat(uint32_t c) {
    if (!at_end() && cps_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  std::string alternation(int depth) {
    std::vector<std::string> alts;
    bool any_nullable = false;
    do {
      alts.push_back(sequence(depth, false));
      any_nullable = any_nullable || nullable_;
    } while (eat('|'));
    for (std::string& a : alts)
      if (a.empty()) a = "\"\"";
    nullable_ = any_nullable;
    return alternatives(alts);
  }

  // Items up to '|', ')' or the end (and, at the top, a final '$').
  std::string sequence(int depth, bool top_level) {
    std::string out;
    bool all_nullable = true;
    while (!at_end() && peek() != '|' && peek() != ')') {
      if (top_level && peek() == '$' && pos_ + 1 == cps_.size()) break;
      if (top_level && peek() == '$' && peek(1) == '|') break;
      const std::string item = quantified(depth);
      all_nullable = all_nullable && nullable_;
      out += (out.empty() ? "" : " ") + item;
    }
    nullable_ = all_nullable;
    return out;
  }

  // {n}, {n,} or {n,m} at pos_ (after '{'), or false (then '{' is a literal, as ECMA-262 annex B reads it).
  bool braces(int& lo, int& hi) {
    size_t p = pos_ + 1;
    auto number = [&](int& v) {
      const size_t from = p;
      long long x = 0;
      while (p < cps_.size() && cps_[p] >= '0' && cps_[p] <= '9') {
        x = x * 10 + (cps_[p] - '0');
        if (x > 1000000) x = 1000000;
        ++p;
      }
      v = static_cast<int>(x);
      return p > from;
    };
    if (!number(lo)) return false;
    hi = lo;
    if (p < cps_.size() && cps_[p] == ',') {
      ++p;
      if (!number(hi)) hi = -1;
    }
    if (p >= cps_.size() || cps_[p] != '}') return false;
    pos_ = p + 1;
    return true;
  }

  std::string quantified(int depth) {
    std::string atom_expr = atom(depth);
    const bool atom_nullable = nullable_;
    int lo = 1, hi = 1;
    std::string q;
    if (eat('*')) {
      q = "*", lo = 0, hi = -1;
    } else if (eat('+')) {
      q = "+", hi = -1;
    } else if (eat('?')) {
      q = "?", lo = 0;
    } else if (peek() == '{') {
      if (braces(lo, hi)) {
        if (lo > kMaxRepeat || hi > kMaxRepeat) unsupported("a repetition count above 1000");
        if (hi >= 0 && hi < lo) throw Error(ErrorKind::InvalidArgument, "pattern: a repetition {n,m} with m < n");
        q = "{" + std::to_string(lo) + (hi == lo ? "" : "," + (hi < 0 ? std::string() : std::to_string(hi))) + "}";
      }
    }
    if (q.empty()) return atom_expr;
    if (atom_nullable && hi != 1) unsupported("repeating a group that can match nothing (such as (a*)*; write a*)");
    nullable_ = atom_nullable || lo == 0;
    eat('?');  // lazy: the same strings
    if (peek() == '*' || peek() == '+' || peek() == '?')
      throw Error(ErrorKind::InvalidArgument, "pattern: nothing to repeat");
    return "( " + atom_expr + " )" + q;
  }

  std::string atom(int depth) {
    const uint32_t c = peek();
    ++pos_;
    nullable_ = false;  // a group's comes from its alternation
    switch (c) {
      case '(': {
        if (depth >= kMaxNesting) unsupported("groups nested deeper than 64");
        if (eat('?')) {
          if (eat(':')) {
          } else if (peek() == '<' && peek(1) != '=' && peek(1) != '!') {
            while (!at_end() && peek() != '>') ++pos_;  // a named group: its name does not matter here
            if (!eat('>')) throw Error(ErrorKind::InvalidArgument, "pattern: an unterminated group name");
          } else {
            unsupported("lookaround (?=, ?!, ?<=, ?<!)");
          }
        }
        std::string inner = alternation(depth + 1);
        if (!eat(')')) throw Error(ErrorKind::InvalidArgument, "pattern: an unterminated group");
        return "( " + inner + " )";
      }
      case '[': return class_gbnf(bracket());
      case '.': {
        CharSet s;
        s.negated = true;
        s.ranges = {{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}};
        return class_gbnf(s);
      }
      case '\\': return escape_atom();
      case '^':
      case '$': unsupported("'^' or '$' inside the pattern");
      case '*':
      case '+':
      case '?': throw Error(ErrorKind::InvalidArgument, "pattern: nothing to repeat");
      default: return literal(c);
    }
  }

  // After a backslash, outside a class.
  std::string escape_atom() {
    if (at_end()) throw Error(ErrorKind::InvalidArgument, "pattern: a trailing backslash");
    const uint32_t e = peek();
    if (e == 'd' || e == 'D' || e == 'w' || e == 'W' || e == 's' || e == 'S') {
      ++pos_;
      return class_gbnf(shorthand(static_cast<char>(e)));
    }
    if (e == 'b' || e == 'B') unsupported("a word boundary (\\b, \\B)");
    if (e >= '1' && e <= '9') unsupported("a backreference");
    if (e == 'k') unsupported("a named backreference");
    return literal(escaped_char(false));
  }

  // The code point of an escape (pos_ after the backslash); `in_class`: \b is a backspace there.
  uint32_t escaped_char(bool in_class) {
    const uint32_t e = peek();
    ++pos_;
    auto hex = [&](int n) {
      uint32_t v = 0;
      for (int i = 0; i < n; ++i) {
        const uint32_t h = peek();
        int d = h >= '0' && h <= '9'   ? int(h - '0')
                : h >= 'a' && h <= 'f' ? int(h - 'a' + 10)
                : h >= 'A' && h <= 'F' ? int(h - 'A' + 10)
                                       : -1;
        if (d < 0) throw Error(ErrorKind::InvalidArgument, "pattern: a malformed hex escape");
        v = v * 16 + static_cast<uint32_t>(d);
        ++pos_;
      }
      return v;
    };
    switch (e) {
      case 'n': return '\n';
      case 't': return '\t';
      case 'r': return '\r';
      case 'f': return '\f';
      case 'v': return '\v';
      case '0': return 0;
      case 'x': return hex(2);
      case 'u': return hex(4);
      case 'b':
        if (in_class) return '\b';
        break;
      default: break;
    }
    if (e == 'c' || e == 'p' || e == 'P') unsupported(std::string("the escape \\") + static_cast<char>(e));
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9'))
      unsupported(std::string("the escape \\") + static_cast<char>(e));
    return e;  // an escaped symbol stands for itself
  }

  // [...] after '['.
  CharSet bracket() {
    CharSet s;
    s.negated = eat('^');
    while (!at_end() && peek() != ']') {
      uint32_t lo;
      if (peek() == '\\') {
        ++pos_;
        const uint32_t e = peek();
        if (e == 'd' || e == 'w' || e == 's') {
          ++pos_;
          for (const Range& r : shorthand(static_cast<char>(e)).ranges) s.ranges.push_back(r);
          continue;
        }
        if (e == 'D' || e == 'W' || e == 'S') unsupported("a negated class escape inside brackets");
        lo = escaped_char(true);
      } else {
        lo = peek();
        ++pos_;
      }
      uint32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && pos_ + 1 < cps_.size()) {
        ++pos_;
        if (peek() == '\\') {
          ++pos_;
          hi = escaped_char(true);
        } else {
          hi = peek();
          ++pos_;
        }
        if (hi < lo) throw Error(ErrorKind::InvalidArgument, "pattern: a class range out of order");
      }
      s.ranges.push_back({lo, hi});
    }
    if (!eat(']')) throw Error(ErrorKind::InvalidArgument, "pattern: an unterminated character class");
    return s;
  }
};

}  // namespace regex_pattern_detail

std::string pattern_gbnf(const std::string& pattern) { return regex_pattern_detail::PatternParser(pattern).top(); }

}  // namespace lathe::grammar
