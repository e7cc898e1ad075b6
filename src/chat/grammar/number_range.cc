#include "chat/grammar/number_range.h"

#include <vector>

#include "common/error.h"

namespace lathe::grammar {
// Named, not anonymous: a unity batch joins this file with others whose anonymous namespaces hold helpers of
// the same names.
namespace number_range_detail {

constexpr uint64_t kMaxMagnitude = 9999999999999999ULL;  // 16 digits, as json-uint

std::string digits_any(size_t n) {
  if (n == 0) return "";
  return n == 1 ? "[0-9]" : "[0-9]{" + std::to_string(n) + "}";
}

std::string digit_class(char a, char b) {
  if (a == b) return std::string("\"") + a + "\"";
  return std::string("[") + a + "-" + b + "]";
}

bool all_of(const std::string& s, char c) { return s.find_first_not_of(c) == std::string::npos; }

std::string seq(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a + " " + b;
}

// Every digit string from a to b (the same length, a ≤ b), leading zeros included.
std::string fixed_width(const std::string& a, const std::string& b) {
  if (a.empty()) return "";
  if (a == b) return "\"" + a + "\"";
  const std::string ra = a.substr(1), rb = b.substr(1);
  if (a[0] == b[0]) return seq(digit_class(a[0], a[0]), fixed_width(ra, rb));
  std::vector<std::string> alts;
  char first = a[0], last = b[0];
  if (!all_of(ra, '0')) {  // a's own first digit, then at least the rest of a
    alts.push_back(seq(digit_class(a[0], a[0]), fixed_width(ra, std::string(ra.size(), '9'))));
    ++first;
  }
  std::string tail;
  if (!all_of(rb, '9')) {  // b's own first digit, then at most the rest of b
    tail = seq(digit_class(b[0], b[0]), fixed_width(std::string(rb.size(), '0'), rb));
    --last;
  }
  if (first <= last) alts.push_back(seq(digit_class(first, last), digits_any(ra.size())));
  if (!tail.empty()) alts.push_back(tail);
  if (alts.size() == 1) return alts[0];
  std::string out;
  for (const std::string& x : alts) out += (out.empty() ? "( " : " | ") + x;
  return out + " )";
}

uint64_t pow10(size_t n) {
  uint64_t p = 1;
  for (size_t i = 0; i < n; ++i) p *= 10;
  return p;
}

// The spellings of magnitudes m (x integral part, f fraction) with lo <= m <= hi, each end open or closed; without
// `bounded`, m runs up to kMaxMagnitude's integral part with any fraction. Empty when none fits.
std::string magnitude(uint64_t lo, bool lo_open, bool bounded, uint64_t hi, bool hi_open, bool fraction) {
  if (!bounded) {
    hi = kMaxMagnitude;
    hi_open = false;
  }
  if (!fraction) {  // integers: open ends are the next integer in
    if (lo_open) ++lo;
    if (hi_open) {
      if (hi == 0) return "";
      --hi;
    }
    return lo <= hi ? uint_range_gbnf(lo, hi) : "";
  }
  const std::string any_frac = "( \".\" [0-9]{1,16} )?";
  std::vector<std::string> alts;
  // Integral parts whose every fraction is inside: up to hi - 1, or hi itself when unbounded.
  const uint64_t first = lo + (lo_open ? 1 : 0);
  if (!bounded) {
    if (first <= hi) alts.push_back(seq(uint_range_gbnf(first, hi), any_frac));
  } else if (hi > 0 && first <= hi - 1) {
    alts.push_back(seq(uint_range_gbnf(first, hi - 1), any_frac));
  }
  // An open lower end: that integral part with a fraction above zero.
  if (lo_open && (!bounded || lo < hi))
    alts.push_back(seq(uint_range_gbnf(lo, lo), "\".\" \"0\"{0,15} [1-9] [0-9]{0,15}"));
  // A closed upper end: exactly it (a zero fraction allowed).
  if (bounded && !hi_open && (lo < hi || (lo == hi && !lo_open)))
    alts.push_back(seq(uint_range_gbnf(hi, hi), "( \".\" \"0\"{1,16} )?"));
  if (alts.empty()) return "";
  if (alts.size() == 1) return alts[0];
  std::string out;
  for (const std::string& x : alts) out += (out.empty() ? "( " : " | ") + x;
  return out + " )";
}

uint64_t magnitude_of(int64_t v) { return v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v); }

}  // namespace number_range_detail

std::string uint_range_gbnf(uint64_t lo, uint64_t hi) {
  const size_t nlo = std::to_string(lo).size(), nhi = std::to_string(hi).size();
  std::vector<std::string> alts;
  for (size_t n = nlo; n <= nhi; ++n) {
    const uint64_t a = n == nlo ? lo : number_range_detail::pow10(n - 1);
    const uint64_t b = n == nhi ? hi : number_range_detail::pow10(n) - 1;
    alts.push_back(number_range_detail::fixed_width(std::to_string(a), std::to_string(b)));
  }
  if (alts.size() == 1) return alts[0];
  std::string out;
  for (const std::string& x : alts) out += (out.empty() ? "( " : " | ") + x;
  return out + " )";
}

std::string number_range_gbnf(const NumberBounds& b, bool integer) {
  std::vector<std::string> alts;
  // v ≥ 0, written as its magnitude.
  const bool nonneg_fits = !b.hi || *b.hi > 0 || (*b.hi == 0 && !b.hi_open);
  if (nonneg_fits) {
    const bool from_bound = b.lo && *b.lo >= 0;
    const std::string m = number_range_detail::magnitude(
        from_bound ? number_range_detail::magnitude_of(*b.lo) : 0, from_bound && b.lo_open, b.hi.has_value(),
        b.hi ? number_range_detail::magnitude_of(*b.hi) : 0, b.hi_open, !integer);
    if (!m.empty()) alts.push_back(m);
  }
  // v < 0, written "-" and its magnitude m > 0: m runs from -hi (or just above 0) up to -lo.
  if (!b.lo || *b.lo < 0) {
    const bool below_zero = b.hi && *b.hi < 0;
    const std::string m = number_range_detail::magnitude(
        below_zero ? number_range_detail::magnitude_of(*b.hi) : 0, below_zero ? b.hi_open : true, b.lo.has_value(),
        b.lo ? number_range_detail::magnitude_of(*b.lo) : 0, b.lo_open, !integer);
    if (!m.empty()) alts.push_back(number_range_detail::seq("\"-\"", m));
  }
  if (alts.empty()) throw Error(ErrorKind::InvalidArgument, "no number lies within the bounds");
  if (alts.size() == 1) return alts[0];
  return "( " + alts[0] + " | " + alts[1] + " )";
}

}  // namespace lathe::grammar
