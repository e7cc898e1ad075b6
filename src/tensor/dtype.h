// Element types and the scalar conversions the kernels share.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace lathe {

enum class DType : uint8_t { F32, F16, BF16, U32, I32, I64, U8, I8, U16, I16, F64, Bool };

size_t dtype_size(DType d);
const char* dtype_name(DType d);  // safetensors spelling: "F32", "BF16", ...
bool dtype_from_name(std::string_view name, DType* out);
inline bool is_float(DType d) { return d == DType::F32 || d == DType::F16 || d == DType::BF16 || d == DType::F64; }

// bf16 is the upper half of an f32; rounding to nearest-even on the way down.
inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// n contiguous BF16, F16 or F32 values at src as f32; false (nothing written) for any other type.
bool floats_to_f32(const void* src, DType t, int64_t n, float* out);

}  // namespace lathe
