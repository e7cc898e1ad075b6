#include "chat/grammar/gbnf.h"

#include <functional>
#include <map>

#include "common/error.h"

namespace lathe::grammar {
namespace {

struct PElem {
  ElemKind kind = ElemKind::Chars;
  bool negated = false;
  uint32_t rule = 0;
  std::vector<CharRange> ranges;
};
using Seq = std::vector<PElem>;

class Parser {
 public:
  Parser(std::string_view s, const GbnfLimits& lim) : s_(s), lim_(lim) {}

  Grammar run() {
    if (s_.size() > lim_.max_bytes)
      fail("the grammar is " + std::to_string(s_.size()) + " bytes; the limit is " + std::to_string(lim_.max_bytes));
    skip_space(true);
    while (pos_ < s_.size()) {
      const std::string name = ident();
      if (name.empty()) fail("expected a rule name");
      skip_space(false);
      if (s_.substr(pos_, 3) != "::=") fail("expected ::= after " + name);
      pos_ += 3;
      const uint32_t id = rule_id(name);
      if (defined_.count(id)) fail("rule " + name + " is defined twice");
      defined_[id] = line_;
      rules_[id] = alternatives(0);
      skip_space(true);
    }
    for (uint32_t i = 0; i < names_.size(); ++i)
      if (!defined_.count(i) && !synthetic_[i]) fail_at(used_line_[i], "rule " + names_[i] + " is not defined");
    auto root = ids_.find("root");
    if (root == ids_.end() || !defined_.count(root->second)) fail_at(1, "the grammar has no root rule");
    Grammar g = flatten(root->second);
    check_left_recursion(g);
    return g;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { fail_at(line_, what); }
  [[noreturn]] static void fail_at(int line, const std::string& what) {
    throw Error(ErrorKind::InvalidArgument, "grammar line " + std::to_string(line) + ": " + what);
  }

  bool at_end() const { return pos_ >= s_.size(); }
  char peek(size_t k = 0) const { return pos_ + k < s_.size() ? s_[pos_ + k] : '\0'; }

  // Spaces and comments; newlines too when `newlines` (rules end where the next `name ::=` starts).
  void skip_space(bool newlines) {
    while (!at_end()) {
      const char c = peek();
      if (c == '#') {
        while (!at_end() && peek() != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        if (c == '\n') ++line_;
        ++pos_;
      } else {
        break;
      }
    }
  }

  static bool ident_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  }
  std::string ident() {
    const size_t start = pos_;
    while (!at_end() && ident_char(peek())) ++pos_;
    return std::string(s_.substr(start, pos_ - start));
  }
  // Is an `ident ::=` ahead (the start of the next rule)?
  bool rule_ahead() const {
    size_t p = pos_;
    while (p < s_.size() && ident_char(s_[p])) ++p;
    if (p == pos_) return false;
    while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t')) ++p;
    return s_.substr(p, 3) == "::=";
  }

  uint32_t rule_id(const std::string& name) {
    auto [it, fresh] = ids_.try_emplace(name, static_cast<uint32_t>(names_.size()));
    if (fresh) new_rule(name, false);
    return it->second;
  }
  uint32_t new_rule(const std::string& name, bool synthetic) {
    if (names_.size() >= lim_.max_rules) fail("more than " + std::to_string(lim_.max_rules) + " rules");
    names_.push_back(name);
    synthetic_.push_back(synthetic);
    used_line_.push_back(line_);
    rules_.emplace_back();
    return static_cast<uint32_t>(names_.size() - 1);
  }
  // Helper rules are named by number ("_12"); built with append (GCC 12 misreads "_" + to_string).
  std::string synthetic_name() const {
    std::string name(1, '_');
    name.append(std::to_string(names_.size()));
    return name;
  }
  uint32_t helper(std::vector<Seq> alts) {
    const uint32_t id = new_rule(synthetic_name(), true);
    rules_[id] = std::move(alts);
    return id;
  }
  static PElem ref(uint32_t id) { return PElem{ElemKind::Ref, false, id, {}}; }
  void count(size_t n) {
    elements_ += n;
    if (elements_ > lim_.max_elements) fail("the grammar expands to too many elements");
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char c = peek();
      int d = -1;
      if (c >= '0' && c <= '9') d = c - '0';
      if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      if (d < 0) fail("expected " + std::to_string(digits) + " hex digits in an escape");
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    if (v > 0x10FFFF) fail("escape beyond U+10FFFF");
    return v;
  }

  // One code point of a literal or class (after an opening quote or bracket), decoding UTF-8 and escapes.
  uint32_t char_at() {
    if (at_end()) fail("unterminated literal or class");
    const unsigned char c = static_cast<unsigned char>(peek());
    if (c == '\\') {
      ++pos_;
      const char e = peek();
      ++pos_;
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': return '\\';
        case '"': return '"';
        case '[': return '[';
        case ']': return ']';
        case '-': return '-';
        case '/': return '/';
        case 'x': return hex(2);
        case 'u': return hex(4);
        case 'U': return hex(8);
        default: fail(std::string("unknown escape \\") + e);
      }
    }
    if (c == '\n') fail("newline inside a literal or class");
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || pos_ + static_cast<size_t>(len) > s_.size()) fail("invalid UTF-8");
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (int i = 1; i < len; ++i) {
      const unsigned char k = static_cast<unsigned char>(s_[pos_ + static_cast<size_t>(i)]);
      if ((k & 0xC0) != 0x80) fail("invalid UTF-8");
      cp = (cp << 6) | (k & 0x3F);
    }
    pos_ += static_cast<size_t>(len);
    return cp;
  }

  std::vector<Seq> alternatives(int depth) {
    if (depth > lim_.max_nesting) fail("groups nested deeper than " + std::to_string(lim_.max_nesting));
    std::vector<Seq> alts;
    alts.push_back(sequence(depth));
    while (peek() == '|') {
      ++pos_;
      alts.push_back(sequence(depth));
    }
    return alts;
  }

  int number() {
    skip_space(false);
    int v = 0;
    bool any = false;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > lim_.max_repeat) fail("repetition count above " + std::to_string(lim_.max_repeat));
      ++pos_;
      any = true;
    }
    skip_space(false);
    return any ? v : -1;
  }

  // Applies a postfix to the unit seq[from, end): the unit becomes one reference to a helper rule.
  void repeat(Seq& seq, size_t from, int min, int max) {  // max < 0: unbounded
    Seq unit(seq.begin() + static_cast<std::ptrdiff_t>(from), seq.end());
    seq.resize(from);
    if (unit.empty()) fail("a repetition needs something to repeat");
    count(unit.size() * static_cast<size_t>(std::max(min, max) + 1));
    for (int i = 0; i < min; ++i) seq.insert(seq.end(), unit.begin(), unit.end());
    if (max < 0) {
      const uint32_t star = new_rule(synthetic_name(), true);
      Seq more = unit;
      more.push_back(ref(star));
      rules_[star] = {more, Seq{}};
      seq.push_back(ref(star));
      return;
    }
    // (unit (unit (…)?)?)? for the max - min optional copies.
    uint32_t tail = 0;
    bool have_tail = false;
    for (int i = 0; i < max - min; ++i) {
      Seq more = unit;
      if (have_tail) more.push_back(ref(tail));
      tail = helper({more, Seq{}});
      have_tail = true;
    }
    if (have_tail) seq.push_back(ref(tail));
  }

  Seq sequence(int depth) {
    Seq seq;
    for (;;) {
      skip_space(true);
      if (at_end() || peek() == '|' || peek() == ')' || rule_ahead()) break;
      const size_t unit_start = seq.size();
      const char c = peek();
      if (c == '"') {
        ++pos_;
        while (peek() != '"') {
          const uint32_t cp = char_at();
          seq.push_back(PElem{ElemKind::Chars, false, 0, {{cp, cp}}});
        }
        ++pos_;
        count(seq.size() - unit_start);
      } else if (c == '[') {
        ++pos_;
        PElem e;
        if (peek() == '^') {
          e.negated = true;
          ++pos_;
        }
        while (peek() != ']') {
          const uint32_t lo = char_at();
          uint32_t hi = lo;
          if (peek() == '-' && peek(1) != ']') {
            ++pos_;
            hi = char_at();
            if (hi < lo) fail("class range with its end before its start");
          }
          e.ranges.push_back({lo, hi});
        }
        ++pos_;
        seq.push_back(std::move(e));
        count(1);
      } else if (c == '.') {
        ++pos_;
        seq.push_back(PElem{ElemKind::Chars, true, 0, {}});
        count(1);
      } else if (c == '(') {
        ++pos_;
        std::vector<Seq> alts = alternatives(depth + 1);
        skip_space(true);
        if (peek() != ')') fail("expected )");
        ++pos_;
        seq.push_back(ref(helper(std::move(alts))));
        count(1);
      } else if (ident_char(c)) {
        const std::string name = ident();
        seq.push_back(ref(rule_id(name)));
        count(1);
      } else {
        fail(std::string("unexpected character '") + c + "'");
      }
      skip_space(false);
      const char post = peek();
      if (post == '*') {
        ++pos_;
        repeat(seq, unit_start, 0, -1);
      } else if (post == '+') {
        ++pos_;
        repeat(seq, unit_start, 1, -1);
      } else if (post == '?') {
        ++pos_;
        repeat(seq, unit_start, 0, 1);
      } else if (post == '{') {
        ++pos_;
        const int min = number();
        if (min < 0) fail("expected a number after {");
        int max = min;
        if (peek() == ',') {
          ++pos_;
          max = number();
        }
        if (peek() != '}') fail("expected } to close a repetition");
        ++pos_;
        if (max >= 0 && max < min) fail("repetition {m,n} with n < m");
        repeat(seq, unit_start, min, max);
      }
    }
    return seq;
  }

  Grammar flatten(uint32_t root) const {
    Grammar g;
    g.root = root;
    g.rule_names = names_;
    g.rule_alts.resize(rules_.size());
    for (size_t r = 0; r < rules_.size(); ++r) {
      for (const Seq& alt : rules_[r]) {
        g.rule_alts[r].push_back(static_cast<uint32_t>(g.elems.size()));
        for (const PElem& p : alt) {
          Element e;
          e.kind = p.kind;
          e.negated = p.negated;
          e.rule = p.rule;
          e.ranges_at = static_cast<uint32_t>(g.ranges.size());
          e.ranges_n = static_cast<uint32_t>(p.ranges.size());
          g.ranges.insert(g.ranges.end(), p.ranges.begin(), p.ranges.end());
          g.elems.push_back(e);
        }
        g.elems.push_back(Element{});
      }
    }
    return g;
  }

  // A rule that can reach itself without consuming input would make the matcher expand forever.
  static void check_left_recursion(const Grammar& g) {
    const size_t n = g.rule_alts.size();
    std::vector<char> nullable(n, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (uint32_t at : g.rule_alts[r]) {
          bool all = true;
          for (uint32_t i = at; g.elems[i].kind != ElemKind::End && all; ++i)
            all = g.elems[i].kind == ElemKind::Ref && nullable[g.elems[i].rule];
          if (all) {
            nullable[r] = changed = true;
            break;
          }
        }
      }
    }
    // Edges r → s where s can come first in r (after nullable prefixes); a cycle is left recursion.
    std::vector<std::vector<uint32_t>> first(n);
    for (size_t r = 0; r < n; ++r)
      for (uint32_t at : g.rule_alts[r])
        for (uint32_t i = at; g.elems[i].kind == ElemKind::Ref; ++i) {
          first[r].push_back(g.elems[i].rule);
          if (!nullable[g.elems[i].rule]) break;
        }
    std::vector<char> state(n, 0);  // 0 new, 1 on the path, 2 done
    std::function<void(uint32_t)> visit = [&](uint32_t r) {
      state[r] = 1;
      for (uint32_t s : first[r]) {
        if (state[s] == 1)
          throw Error(ErrorKind::InvalidArgument, "grammar: rule " + g.rule_names[s] + " is left-recursive");
        if (state[s] == 0) visit(s);
      }
      state[r] = 2;
    };
    for (uint32_t r = 0; r < n; ++r)
      if (state[r] == 0) visit(r);
  }

  std::string_view s_;
  GbnfLimits lim_;
  size_t pos_ = 0;
  int line_ = 1;
  size_t elements_ = 0;
  std::map<std::string, uint32_t> ids_;
  std::vector<std::string> names_;
  std::vector<bool> synthetic_;
  std::vector<int> used_line_;
  std::vector<std::vector<Seq>> rules_;
  std::map<uint32_t, int> defined_;
};

}  // namespace

Grammar parse_gbnf(std::string_view text, const GbnfLimits& limits) { return Parser(text, limits).run(); }

}  // namespace lathe::grammar
