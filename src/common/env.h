// LATHE_* environment settings, read one way everywhere: on/off switches (on unless "0") and integers.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace lathe {

// False when `name` is set to "0", true when it is set to anything else, `unset` when it is absent.
inline bool env_switch(const char* name, bool unset = true) {
  const char* e = std::getenv(name);
  return e ? std::strcmp(e, "0") != 0 : unset;
}

// The integer `name` holds, or `unset` when it is absent or not a whole number.
inline int64_t env_int(const char* name, int64_t unset) {
  const char* e = std::getenv(name);
  if (!e || !*e) return unset;
  char* end = nullptr;
  const long long v = std::strtoll(e, &end, 10);
  return *end == '\0' ? static_cast<int64_t>(v) : unset;
}

}  // namespace lathe
