#include "io/finite_check.h"

#include <cstring>

namespace lathe {
namespace {

// Bits read with memcpy: a safetensors tensor may start at any byte offset of its file.
template <typename Bits>
int64_t first_all_ones_exponent(const Tensor& t, Bits exponent_mask) {
  const auto* p = static_cast<const unsigned char*>(t.raw());
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    Bits v;
    std::memcpy(&v, p + static_cast<size_t>(i) * sizeof(Bits), sizeof v);
    if ((v & exponent_mask) == exponent_mask) return i;
  }
  return -1;
}

}  // namespace

int64_t first_non_finite(const Tensor& t) {
  if (!t.defined() || t.device() != Device::CPU || !t.is_contiguous()) return -1;
  switch (t.dtype()) {
    case DType::F32: return first_all_ones_exponent<uint32_t>(t, 0x7F800000u);
    case DType::F16: return first_all_ones_exponent<uint16_t>(t, uint16_t{0x7C00});
    case DType::BF16: return first_all_ones_exponent<uint16_t>(t, uint16_t{0x7F80});
    case DType::F64: return first_all_ones_exponent<uint64_t>(t, 0x7FF0000000000000ull);
    default: return -1;
  }
}

}  // namespace lathe
