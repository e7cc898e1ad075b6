// Load-time repacking of MLX affine weights into the integer-dot layout (the layout is defined in
// packed_quant.h).
#include "tensor/cpu/packed_quant.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "common/error.h"
#include "quant/affine.h"
#include "tensor/host_buffer_cache.h"
#include "tensor/ops.h"
#include "tensor/thread_pool.h"

namespace lathe {
namespace cpu {
namespace {

// One scale or bias (bf16, f16 or f32) as f32.
float value_at(const Tensor& t, int64_t row, int64_t g) {
  const char* at =
      static_cast<const char*>(t.raw()) + (row * t.stride(0) + g) * static_cast<int64_t>(dtype_size(t.dtype()));
  float f = 0.f;
  if (!floats_to_f32(at, t.dtype(), 1, &f))
    throw Error(ErrorKind::Unsupported, std::string("quantization scales of dtype ") + dtype_name(t.dtype()));
  return f;
}

// Group g of block b: the codes of rows r < live (the others stay zero), then scales and biases.
void pack_group(const QuantizedMatrix& q, const PackedQuant& p, int64_t b, int64_t g, uint8_t* out) {
  constexpr int R = PackedQuant::kBlockRows;
  const int64_t gs = p.group_size, n0 = b * R;
  const int live = static_cast<int>(std::min<int64_t>(R, p.rows - n0));
  std::memset(out, 0, static_cast<size_t>(p.group_bytes));
  if (q.bits != p.bits) {
    // 2/3-bit codes widened to the 4-bit layout, 5/6-bit ones to the 8-bit layout (packed_quant.h), one by one.
    for (int r = 0; r < live; ++r) {
      const uint32_t* row = q.w.data<uint32_t>() + (n0 + r) * q.w.stride(0);
      for (int64_t e = 0; e < gs; ++e) {
        const uint32_t code = quant::code_at(row, q.bits, g * gs + e);
        if (p.bits == 8)
          out[(e / 4) * 64 + 4 * r + e % 4] = static_cast<uint8_t>(code);
        else
          out[(e / 8) * 64 + 4 * r + e % 4] |= static_cast<uint8_t>(e % 8 < 4 ? code : code << 4);
      }
    }
  }
  // Word w of a row's group holds elements 8w..8w+7 (4-bit) or 4w..4w+3 (8-bit), from its low end: exactly
  // chunk w's four bytes of that row.
  const int64_t words_per_group = q.bits == p.bits ? gs * p.bits / 32 : 0;
  for (int r = 0; r < live && words_per_group > 0; ++r) {
    const uint32_t* words = q.w.data<uint32_t>() + (n0 + r) * q.w.stride(0) + g * words_per_group;
    for (int64_t w = 0; w < words_per_group; ++w) {
      const uint32_t v = words[w];
      uint8_t* dst = out + w * 64 + 4 * r;
      if (p.bits == 8) {
        static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__);
        std::memcpy(dst, &v, 4);
        continue;
      }
      for (int j = 0; j < 4; ++j)
        dst[j] = static_cast<uint8_t>(((v >> (4 * j)) & 0xF) | (((v >> (4 * j + 16)) & 0xF) << 4));
    }
  }
  uint8_t* sb = out + p.code_bytes;
  for (int r = 0; r < live; ++r) {
    if (p.sb16) {  // the bf16 bits as they are
      std::memcpy(sb + 2 * r, q.scales.data<uint16_t>() + (n0 + r) * q.scales.stride(0) + g, 2);
      std::memcpy(sb + 2 * (R + r), q.biases.data<uint16_t>() + (n0 + r) * q.biases.stride(0) + g, 2);
    } else {
      const float s = value_at(q.scales, n0 + r, g), bias = value_at(q.biases, n0 + r, g);
      std::memcpy(sb + 4 * r, &s, 4);
      std::memcpy(sb + 4 * (R + r), &bias, 4);
    }
  }
}

}  // namespace

std::shared_ptr<const PackedQuant> pack_quantized(const QuantizedMatrix& q, int act_bits) {
  if (!q.w.defined() || q.w.device() != Device::CPU) return nullptr;
  if (q.bits < 2 || q.bits > 8 || q.bits == 7) return nullptr;
  if (q.group_size != 32 && q.group_size != 64 && q.group_size != 128) return nullptr;
  const int64_t rows = q.rows(), cols = q.cols();
  if (cols % q.group_size != 0) return nullptr;
  if (q.w.stride(1) != 1 || q.scales.stride(1) != 1 || q.biases.stride(1) != 1) return nullptr;
  constexpr int R = PackedQuant::kBlockRows;
  auto p = std::make_shared<PackedQuant>();
  p->bits = q.bits <= 4 ? 4 : 8;  // the layout's code width: 2 and 3-bit codes in nibbles, 5 and 6-bit in bytes
  p->group_size = q.group_size;
  p->act_bits = act_bits == 16 ? 16 : 8;
  p->rows = rows;
  p->cols = cols;
  p->groups = cols / q.group_size;
  p->blocks = (rows + R - 1) / R;
  p->sb16 = q.scales.dtype() == DType::BF16 && q.biases.dtype() == DType::BF16;
  p->code_bytes = int64_t{R} * q.group_size * p->bits / 8;
  p->group_bytes = p->code_bytes + 2 * R * (p->sb16 ? 2 : 4);
  p->block_bytes = p->groups * p->group_bytes;
  const size_t total = static_cast<size_t>(p->blocks * p->block_bytes);
  p->data.reset(static_cast<uint8_t*>(std::aligned_alloc(64, std::max<size_t>(64, (total + 63) / 64 * 64))));
  if (!p->data) throw std::bad_alloc();
  populate_host_pages(p->data.get(), total);  // written whole below: its pages in one call (0.6B load: 88 k faults)
  parallel_for(p->blocks, 4, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t g = 0; g < p->groups; ++g)
        pack_group(q, *p, b, g, p->data.get() + b * p->block_bytes + g * p->group_bytes);
  });
  return p;
}

}  // namespace cpu

void pack_for_cpu(QuantizedMatrix& q, int act_bits) {
  q.cpu_packed = cpu::pack_quantized(q, act_bits);
  q.cpu_packed_row0 = 0;
}

}  // namespace lathe
