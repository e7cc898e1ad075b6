// A context-free grammar over Unicode code points, as GBNF describes it: rules of alternatives, each a sequence
// of character classes and rule references. Repetition and groups are already lowered to helper rules, so the
// matcher (grammar_matcher.h) only ever sees these three element kinds. Built by parse_gbnf.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace lathe::grammar {

struct CharRange {
  uint32_t lo, hi;  // inclusive code points
};

enum class ElemKind : uint8_t { End, Chars, Ref };

struct Element {
  ElemKind kind = ElemKind::End;
  bool negated = false;    // Chars: matches code points in none of the ranges ("." = negated, no ranges)
  uint32_t rule = 0;       // Ref: the rule it expands to
  uint32_t ranges_at = 0;  // Chars: ranges[ranges_at, ranges_at + ranges_n)
  uint32_t ranges_n = 0;
};

struct Grammar {
  // Every alternative of every rule laid end to end, each closed by an End element.
  std::vector<Element> elems;
  std::vector<CharRange> ranges;
  std::vector<std::vector<uint32_t>> rule_alts;  // per rule: the index in elems where each alternative starts
  std::vector<std::string> rule_names;
  uint32_t root = 0;

  bool matches(const Element& e, uint32_t cp) const {
    bool in = false;
    for (uint32_t i = 0; i < e.ranges_n && !in; ++i) {
      const CharRange& r = ranges[e.ranges_at + i];
      in = cp >= r.lo && cp <= r.hi;
    }
    return in != e.negated;
  }
};

}  // namespace lathe::grammar
