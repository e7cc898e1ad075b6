#include "tensor/dtype.h"

namespace lathe {

size_t dtype_size(DType d) {
  switch (d) {
    case DType::F32:
    case DType::U32:
    case DType::I32: return 4;
    case DType::F16:
    case DType::BF16:
    case DType::U16:
    case DType::I16: return 2;
    case DType::I64:
    case DType::F64: return 8;
    case DType::U8:
    case DType::I8:
    case DType::Bool: return 1;
  }
  return 0;
}

namespace {
struct NameEntry {
  DType d;
  const char* name;
};
constexpr NameEntry kNames[] = {
    {DType::F32, "F32"}, {DType::F16, "F16"}, {DType::BF16, "BF16"}, {DType::U32, "U32"},
    {DType::I32, "I32"}, {DType::I64, "I64"}, {DType::U8, "U8"},     {DType::I8, "I8"},
    {DType::U16, "U16"}, {DType::I16, "I16"}, {DType::F64, "F64"},   {DType::Bool, "BOOL"},
};
}  // namespace

const char* dtype_name(DType d) {
  for (const auto& e : kNames)
    if (e.d == d) return e.name;
  return "?";
}

bool dtype_from_name(std::string_view name, DType* out) {
  for (const auto& e : kNames)
    if (name == e.name) {
      *out = e.d;
      return true;
    }
  return false;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 112) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  int32_t exp = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffffu;
  if (((x >> 23) & 0xff) == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - exp);
    uint32_t half = 1u << (shift - 1);
    uint32_t rounded = (mant + half - 1 + ((mant >> shift) & 1)) >> shift;
    return static_cast<uint16_t>(sign | rounded);
  }
  uint32_t rounded = mant + 0xfffu + ((mant >> 13) & 1);
  if (rounded & 0x800000u) {
    rounded = 0;
    ++exp;
    if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  }
  return static_cast<uint16_t>(sign | static_cast<uint32_t>(exp) << 10 | rounded >> 13);
}

bool floats_to_f32(const void* src, DType t, int64_t n, float* out) {
  const auto* h = static_cast<const uint16_t*>(src);
  switch (t) {
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(h[i]);
      return true;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(h[i]);
      return true;
    case DType::F32: std::memcpy(out, src, static_cast<size_t>(n) * sizeof(float)); return true;
    default: return false;
  }
}

}  // namespace lathe
