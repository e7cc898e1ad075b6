// Load-time repacking of MLX affine weights into the integer-dot layout (the layout is defined in
// packed_quant.h).
#include "tensor/cpu/packed_quant.h"

#include <cstring>

#include "common/error.h"
#include "tensor/cpu/kernels.h"
#include "tensor/ops.h"
#include "tensor/thread_pool.h"

namespace lathe {
namespace cpu {
namespace {

void pack_row4(const uint32_t* words, int64_t cols, uint8_t* out) {
  uint8_t e[64];
  for (int64_t u = 0; u < cols / 64; ++u) {
    for (int i = 0; i < 8; ++i) {
      const uint32_t w = words[u * 8 + i];
      for (int j = 0; j < 8; ++j) e[i * 8 + j] = static_cast<uint8_t>((w >> (4 * j)) & 0xF);
    }
    for (int j = 0; j < 32; ++j) out[u * 32 + j] = static_cast<uint8_t>(e[j] | (e[32 + j] << 4));
  }
}

void pack_row8(const uint32_t* words, int64_t cols, uint8_t* out) {
  // Element j of a word sits at bits 8j: on a little-endian CPU the words' bytes are the codes in order.
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__);
  std::memcpy(out, words, static_cast<size_t>(cols));
  for (int64_t k = 0; k < cols; ++k) out[k] ^= 0x80;  // code − 128 as int8
}

}  // namespace

std::shared_ptr<const PackedQuant> pack_quantized(const QuantizedMatrix& q) {
  if (!q.w.defined() || q.w.device() != Device::CPU) return nullptr;
  if (q.bits != 4 && q.bits != 8) return nullptr;
  if (q.group_size != 32 && q.group_size != 64 && q.group_size != 128) return nullptr;
  const int64_t rows = q.rows(), cols = q.cols();
  if (cols % 64 != 0 || cols % q.group_size != 0) return nullptr;
  if (q.w.stride(1) != 1 || q.scales.stride(1) != 1 || q.biases.stride(1) != 1) return nullptr;
  auto p = std::make_shared<PackedQuant>();
  p->bits = q.bits;
  p->group_size = q.group_size;
  p->rows = rows;
  p->cols = cols;
  p->groups = cols / q.group_size;
  p->group_stride = (p->groups + 7) / 8 * 8;
  p->code_bytes = cols * q.bits / 8;
  p->sb16 = q.scales.dtype() == DType::BF16 && q.biases.dtype() == DType::BF16;
  const int64_t GP = p->group_stride;
  p->row_bytes = p->code_bytes + (p->sb16 ? 4 * GP : 0);
  p->codes.reset(new uint8_t[static_cast<size_t>(rows * p->row_bytes)]);
  if (!p->sb16) {
    p->scales.assign(static_cast<size_t>(rows * GP), 0.f);
    p->biases.assign(static_cast<size_t>(rows * GP), 0.f);
  }
  parallel_for(rows, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint32_t* words = q.w.data<uint32_t>() + r * q.w.stride(0);
      uint8_t* out = p->codes.get() + r * p->row_bytes;
      if (q.bits == 4)
        pack_row4(words, cols, out);
      else
        pack_row8(words, cols, out);
      if (p->sb16) {
        // The bf16 bits as they are, zero-padded to the group stride.
        uint16_t* tail = reinterpret_cast<uint16_t*>(out + p->code_bytes);
        std::memset(tail, 0, static_cast<size_t>(4 * GP));
        std::memcpy(tail, q.scales.data<uint16_t>() + r * q.scales.stride(0), static_cast<size_t>(2 * p->groups));
        std::memcpy(tail + GP, q.biases.data<uint16_t>() + r * q.biases.stride(0), static_cast<size_t>(2 * p->groups));
        continue;
      }
      float* s = p->scales.data() + r * p->group_stride;
      float* b = p->biases.data() + r * p->group_stride;
      scale_row_to_f32(q.scales, r, p->groups, s);
      scale_row_to_f32(q.biases, r, p->groups, b);
      if (q.bits == 8)
        for (int64_t g = 0; g < p->groups; ++g) b[g] += 128.0f * s[g];
    }
  });
  return p;
}

}  // namespace cpu

void pack_for_cpu(QuantizedMatrix& q) {
  q.cpu_packed = cpu::pack_quantized(q);
  q.cpu_packed_row0 = 0;
}

}  // namespace lathe
