// The CPU's load-time layout of MLX affine-quantized weights for the integer-dot kernels (the one place
// this layout is defined). Built once per weight by pack_for_cpu (tensor/ops.h); the MLX tensors stay as
// they are (embedding rows and the exact path read them).
//
// Row n of the matrix is row_bytes contiguous bytes at codes[n * row_bytes]:
//   4-bit: 64-element units of 32 bytes; byte j of unit u holds element 64u + j in its low nibble and
//          element 64u + 32 + j in its high nibble, so one 256-bit load gives, after a mask and a shift,
//          the codes of 32 consecutive elements twice (matching 32 consecutive int8 activations).
//   8-bit: one signed byte per element in natural order, code − 128 (vpmaddubsw needs one unsigned operand:
//          the kernel multiplies |code − 128| by the activation carrying the code's sign).
// scales / biases: f32 [rows, group_stride], converted once from bf16/f16; group_stride is groups rounded up
// to 8 and the padding is zero (the kernels read whole quads and octets of groups). For 8-bit the bias holds
// bias + 128·scale, which moves the −128 of the codes into the per-group bias term.
//
// The kernels (quantized_int8.cc) quantize each activation row once per matmul to int8 per weight group
// (d = max|x| / 127, round to nearest even) with the group's sum of quantized values xsum = d · Σ xq, so
//   y[m, n] = Σ_g scale[n, g] · d[m, g] · Σ_{k∈g} code[n, k] · xq[m, k] + Σ_g bias[n, g] · xsum[m, g],
// which is the exact dot product of the dequantized weights with the quantized activations.
// Every output is computed by the same sequence of operations whatever the number of rows in the call, and
// whatever the instruction set: each group's integer dot is split into two exact halves (elements with
// k mod 32 < 16, and the rest), and the float steps that follow are fixed (quantized_int8.cc), so the scalar,
// AVX2 and VNNI kernels give bitwise the same outputs.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

namespace lathe {
struct QuantizedMatrix;
}

namespace lathe::cpu {

struct PackedQuant {
  int bits = 4, group_size = 64;
  int64_t rows = 0, cols = 0, groups = 0, group_stride = 0, row_bytes = 0;
  std::unique_ptr<uint8_t[]> codes;  // rows * row_bytes, not zero-filled first (the repack writes every byte)
  std::vector<float> scales, biases;
};

// The packed layout of q, or null when the integer-dot kernels do not cover it (bits other than 4 or 8,
// columns not a multiple of 64, weights not on the CPU).
std::shared_ptr<const PackedQuant> pack_quantized(const QuantizedMatrix& q);

// y[M, N] for rows [row0, row0 + N) of the packed matrix; x is [M, cols] f32 row-major, y [M, N].
void linear_packed(const float* x, int64_t M, const PackedQuant& p, int64_t row0, int64_t N, float* y);

}  // namespace lathe::cpu
