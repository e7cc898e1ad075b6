// JSON-schema numeric bounds as GBNF: the decimal spellings of every number in a range, so that a schema's
// "minimum": 1, "maximum": 10 (pydantic's ge/le, zod's min/max) is enforced by the grammar, not refused.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace lathe::grammar {

// Every integer in [lo, hi] (0 ≤ lo ≤ hi) in decimal without leading zeros, as one GBNF expression.
std::string uint_range_gbnf(uint64_t lo, uint64_t hi);

// Integral bounds of a JSON number; absent means unbounded (up to the 16 digits the JSON primitives allow).
struct NumberBounds {
  std::optional<int64_t> lo, hi;
  bool lo_open = false, hi_open = false;  // exclusiveMinimum / exclusiveMaximum
};

// A GBNF expression for the JSON numbers within `b`, written without an exponent (an integer: without a
// fraction either). Throws Error(InvalidArgument) when no number fits.
std::string number_range_gbnf(const NumberBounds& b, bool integer);

}  // namespace lathe::grammar
