// Response and tool-call ids, and the creation time responses carry (declared in generation_flow.h; kept
// apart so that the request parsers link without the generation machinery, e.g. in the fuzz targets).
#include <chrono>
#include <random>

#include "server/generation_flow.h"

namespace lathe::server {

std::string random_hex(size_t n) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* digits = "0123456789abcdef";
  std::string s(n, '0');
  for (char& c : s) c = digits[rng() & 15];
  return s;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace lathe::server
