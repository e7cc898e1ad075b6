#include "engine/dense_weights_budget.h"

#include <algorithm>
#include <cctype>
#include <limits>

#include "common/error.h"

namespace lathe {

DenseWeightsSetting parse_dense_weights(const std::string& text) {
  DenseWeightsSetting s;
  if (text == "auto") return s;
  if (text == "on") {
    s.mode = DenseWeightsSetting::Mode::On;
    return s;
  }
  if (text == "off") {
    s.mode = DenseWeightsSetting::Mode::Off;
    return s;
  }
  auto bad = [&] {
    return Error(ErrorKind::InvalidArgument,
                 "--cuda-dense-weights: expected auto, on, off or a byte count such as 8G, got '" + text + "'");
  };
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0 || digits > 18 || text.size() - digits > 1) throw bad();
  int shift = 0;
  if (digits < text.size()) {
    switch (std::toupper(static_cast<unsigned char>(text[digits]))) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      case 'T': shift = 40; break;
      default: throw bad();
    }
  }
  const int64_t n = std::stoll(text.substr(0, digits));
  if (n > (std::numeric_limits<int64_t>::max() >> shift)) throw bad();
  s.mode = DenseWeightsSetting::Mode::Bytes;
  s.bytes = n << shift;
  return s;
}

int64_t dense_weights_headroom(int64_t device_free) {
  return std::max<int64_t>(int64_t{1} << 30, std::max<int64_t>(device_free, 0) / 16);
}

int64_t dense_weights_budget(const DenseWeightsSetting& s, int64_t device_free, int64_t kv_bytes) {
  if (s.mode == DenseWeightsSetting::Mode::Off || device_free <= 0) return 0;
  const int64_t spare =
      std::max<int64_t>(0, device_free - std::max<int64_t>(kv_bytes, 0) - dense_weights_headroom(device_free));
  switch (s.mode) {
    case DenseWeightsSetting::Mode::On: return spare;
    case DenseWeightsSetting::Mode::Bytes: return std::min(spare, s.bytes);
    default: return std::min(spare, device_free / 4);
  }
}

}  // namespace lathe
