// The CPU's load-time layout of MLX affine-quantized weights for the integer-dot kernels (the one place
// this layout is defined). Built once per weight by pack_for_cpu (tensor/ops.h); the MLX tensors stay as
// they are (embedding rows and the exact path read them).
//
// Rows are interleaved in blocks of 16 (the last block padded with zero rows), so one 512-bit register holds
// four consecutive codes of 16 rows and a vpdpbusd against four activations broadcast to every lane adds one
// step of 16 dot products at once: no horizontal sums, and every lane belongs to one output. A block is one
// contiguous run of bytes, group after group; group g of block b is group_bytes at group(b, g):
//   codes, in 64-byte chunks; byte 4·r + j of a chunk belongs to row r (0..15) of the block:
//     4-bit: chunk c holds elements 8c + j (low nibble) and 8c + 4 + j (high nibble) of the group, j < 4;
//     8-bit: chunk c holds element 4c + j of the group, as stored by MLX (unsigned 0..255);
//   then the 16 rows' scales, then their 16 biases: bf16 as in the checkpoint (sb16, most MLX checkpoints:
//   no more bytes than the checkpoint holds) or f32 converted once at load (f16 / f32 scales).
// Group records are multiples of 64 bytes and the array is 64-byte aligned, so every chunk load is aligned.
// 2 and 3-bit checkpoints are packed in the 4-bit layout (codes 0..3 / 0..7 in nibbles), 5 and 6-bit ones in the
// 8-bit layout (codes in bytes): `bits` is the layout's width, the formula below is unchanged, and such a weight
// streams 4 or 8 bits per code instead of the 16 of the bf16 copy it would otherwise need.
//
// The kernels (quantized_int8.cc) quantize each activation row once per matmul to int8 per weight group
// (d = max|x| / 127, round to nearest even) with the group's integer sum Σ xq and xsum = d · Σ xq; then for
// output n and each group g in order, with the exact integer dot isum = Σ_{k∈g} code[n, k] · xq[k],
//   acc = fma(float(isum), scale[n, g] · d[g], acc);   acc = fma(bias[n, g], xsum[g], acc)
// from acc = +0, and y = acc: the exact dot of the dequantized weights with the quantized activations, summed
// in one fixed order. The integer dot is exact however a kernel forms it, so the scalar, AVX2, AVX-VNNI and
// AVX-512 VNNI kernels give bitwise the same outputs, and a row's output never depends on the other rows of
// the call.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace lathe {
struct QuantizedMatrix;
}

namespace lathe::cpu {

struct PackedQuant {
  static constexpr int kBlockRows = 16;
  int bits = 4, group_size = 64;
  bool sb16 = false;  // bf16 scales and biases (else f32)
  // Activation precision of the calls on this weight: 8 (int8 per group), or 16: each row quantized to
  // ±32512 per group (d = max|x| / 32512) and split exactly into two int8 rows, xq = 255 · hi + lo with
  // |hi|, |lo| ≤ 127, which the kernels run as two rows (hi with scale 255 · d, lo with d) and add: y = y_hi + y_lo.
  // Decode reads the weights once either way (a 2-row call costs about a 1-row one); prefill does twice the
  // integer work. For models whose recurrences amplify int8 rounding (Gated DeltaNet layers).
  int act_bits = 8;
  int64_t rows = 0, cols = 0, groups = 0, blocks = 0;
  int64_t code_bytes = 0;   // one group's codes in a block: 16 · group_size · bits / 8
  int64_t group_bytes = 0;  // one group of a block: its codes, then 16 scales and 16 biases
  int64_t block_bytes = 0;  // groups · group_bytes
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t[], Free> data;  // blocks · block_bytes, 64-byte aligned

  const uint8_t* group(int64_t block, int64_t g) const { return data.get() + block * block_bytes + g * group_bytes; }
  // The 16 scales / biases of a block's group in the kernels' form: bf16 (uint16_t) with sb16, else f32.
  const void* scales(int64_t block, int64_t g) const { return group(block, g) + code_bytes; }
  const void* biases(int64_t block, int64_t g) const {
    return group(block, g) + code_bytes + kBlockRows * (sb16 ? 2 : 4);
  }
  // One code, scale or bias of row n (the scalar kernel and tests).
  int code(int64_t n, int64_t k) const {
    const int64_t e = k % group_size;
    const uint8_t* g = group(n / kBlockRows, k / group_size);
    const int r = static_cast<int>(n % kBlockRows);
    if (bits == 8) return g[(e / 4) * 64 + 4 * r + e % 4];
    const uint8_t byte = g[(e / 8) * 64 + 4 * r + e % 4];
    return e % 8 < 4 ? (byte & 0xF) : (byte >> 4);
  }
  float scale(int64_t n, int64_t g) const { return value(scales(n / kBlockRows, g), n % kBlockRows); }
  float bias(int64_t n, int64_t g) const { return value(biases(n / kBlockRows, g), n % kBlockRows); }

 private:
  float value(const void* base, int64_t i) const {
    if (!sb16) return static_cast<const float*>(base)[i];
    const uint32_t bits32 = static_cast<uint32_t>(static_cast<const uint16_t*>(base)[i]) << 16;
    float f;
    std::memcpy(&f, &bits32, sizeof f);
    return f;
  }
};

// The packed layout of q, or null when the integer-dot kernels do not cover it (bits other than 2–6 or 8, groups
// other than 32, 64 or 128, weights not on the CPU).
std::shared_ptr<const PackedQuant> pack_quantized(const QuantizedMatrix& q, int act_bits = 8);

// y[M, N] for rows [row0, row0 + N) of the packed matrix; x is [M, cols] f32 row-major, y [M, N].
void linear_packed(const float* x, int64_t M, const PackedQuant& p, int64_t row0, int64_t N, float* y);

// One weight of linear_packed_many: rows [row0, row0 + N) of *p into y[M, N].
struct PackedLinear {
  const PackedQuant* p = nullptr;
  int64_t row0 = 0, N = 0;
  float* y = nullptr;
};
// linear_packed for several weights over the same x (q|k|v, gate|up), which must share cols, group_size and
// act_bits: x is quantized once (a row's int8 form depends only on the row and the group size) and every
// weight's blocks go through one parallel region, so each y is bitwise its own linear_packed call's.
void linear_packed_many(const float* x, int64_t M, const PackedLinear* calls, int n);
// Whether linear_packed_many may take a and b together.
inline bool packed_share_input(const PackedQuant& a, const PackedQuant& b) {
  return a.cols == b.cols && a.group_size == b.group_size && a.act_bits == b.act_bits;
}

}  // namespace lathe::cpu
