// Python str semantics for the methods and filters that templates call on message text.
#include <algorithm>
#include <cctype>

#include "chat/jinja/budget.h"
#include "chat/jinja/builtins.h"
#include "common/error.h"

namespace lathe::jinja {
namespace {

// Python's str.isspace() for the ASCII range, which is all chat templates strip.
bool py_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }

}  // namespace

std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  const bool by_set = chars && chars->is_string();
  auto strip_char = [&](unsigned char c) {
    return by_set ? chars->as_string().find(static_cast<char>(c)) != std::string::npos : py_space(c);
  };
  size_t begin = 0, end = s.size();
  if (left)
    while (begin < end && strip_char(static_cast<unsigned char>(s[begin]))) ++begin;
  if (right)
    while (end > begin && strip_char(static_cast<unsigned char>(s[end - 1]))) --end;
  return s.substr(begin, end - begin);
}

std::vector<std::string> py_split(const std::string& s, const Value* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (!sep || sep->is_none() || sep->is_undefined()) {
    size_t i = 0;
    while (true) {
      while (i < s.size() && py_space(static_cast<unsigned char>(s[i]))) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        size_t end = s.size();
        while (end > i && py_space(static_cast<unsigned char>(s[end - 1]))) --end;
        out.push_back(s.substr(i, end - i));
        break;
      }
      size_t j = i;
      while (j < s.size() && !py_space(static_cast<unsigned char>(s[j]))) ++j;
      out.push_back(s.substr(i, j - i));
      i = j;
    }
    return out;
  }
  if (!sep->is_string()) throw Error(ErrorKind::InvalidArgument, "must be str or None, not " + sep->type_name());
  const std::string& d = sep->as_string();
  if (d.empty()) throw Error(ErrorKind::InvalidArgument, "empty separator");
  size_t start = 0;
  while (true) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) break;
    const size_t at = s.find(d, start);
    if (at == std::string::npos) break;
    out.push_back(s.substr(start, at - start));
    start = at + d.size();
  }
  out.push_back(s.substr(start));
  return out;
}

std::string py_lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string py_upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string py_title(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (std::isalpha(u)) {
      c = static_cast<char>(prev_cased ? std::tolower(u) : std::toupper(u));
      prev_cased = true;
    } else {
      prev_cased = false;
    }
  }
  return out;
}

std::string py_capitalize(const std::string& s) {
  std::string out = py_lower(s);
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  // The most insertions possible, sized before building ("x".replace("", big) grows with len(s) * len(big)).
  size_t most = from.empty() ? s.size() + 1 : s.size() / from.size();
  if (count >= 0) most = std::min<size_t>(most, static_cast<size_t>(count));
  RenderBudget::check_string(to.size() != 0 && most > SIZE_MAX / to.size() ? SIZE_MAX : s.size() + most * to.size(),
                             "a replaced string");
  std::string out;
  if (from.empty()) {
    // Python inserts `to` between every character (and at both ends).
    int64_t done = 0;
    for (const char c : s) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      out += c;
    }
    if (count < 0 || done < count) out += to;
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(from, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start);
    out += to;
    start = at + from.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

}  // namespace lathe::jinja
