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
// scales / biases, one of two ways (group_stride is groups rounded up to 8, the padding zero: the kernels read
// whole quads and octets of groups):
//   sb16 (weights whose scales and biases are bf16, i.e. most MLX checkpoints): the row's bf16 scales then
//          its bf16 biases, group_stride of each, right after its codes in the same row, so decode streams
//          one contiguous run of bytes per row, no more than the checkpoint holds (8-bit: the kernels add
//          128·scale to the bias as they read it);
//   else:  f32 [rows, group_stride] arrays, converted once from bf16/f16. For 8-bit the bias holds
//          bias + 128·scale, which moves the −128 of the codes into the per-group bias term.
// Either way the kernels compute with the same f32 values (bf16 widens to f32 exactly).
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
#include <cstring>
#include <memory>
#include <vector>

namespace lathe {
struct QuantizedMatrix;
}

namespace lathe::cpu {

struct PackedQuant {
  int bits = 4, group_size = 64;
  bool sb16 = false;  // bf16 scales and biases after each row's codes (else the f32 arrays below)
  int64_t rows = 0, cols = 0, groups = 0, group_stride = 0;
  int64_t code_bytes = 0;             // one row's codes
  int64_t row_bytes = 0;              // one row: its codes, and with sb16 its scales and biases
  std::unique_ptr<uint8_t[]> codes;   // rows * row_bytes, not zero-filled first (the repack writes every byte)
  std::vector<float> scales, biases;  // without sb16: [rows, group_stride]

  const uint8_t* row(int64_t n) const { return codes.get() + n * row_bytes; }
  // Row n's scales / biases in the kernels' form: bf16 (uint16_t) with sb16, else f32.
  const void* scale_row(int64_t n) const {
    return sb16 ? static_cast<const void*>(row(n) + code_bytes) : scales.data() + n * group_stride;
  }
  const void* bias_row(int64_t n) const {
    return sb16 ? static_cast<const void*>(row(n) + code_bytes + 2 * group_stride) : biases.data() + n * group_stride;
  }
  // One scale or bias as f32 (the scalar kernel).
  float scale(int64_t n, int64_t g) const { return value(scale_row(n), g); }
  float bias(int64_t n, int64_t g) const {
    // 8-bit with sb16: the −128 of the codes joins the bias here (128·scale is exact, so this equals the f32
    // layout's stored sum).
    return sb16 && bits == 8 ? value(bias_row(n), g) + 128.0f * value(scale_row(n), g) : value(bias_row(n), g);
  }

 private:
  float value(const void* base, int64_t g) const {
    if (!sb16) return static_cast<const float*>(base)[g];
    const uint32_t bits32 = static_cast<uint32_t>(static_cast<const uint16_t*>(base)[g]) << 16;
    float f;
    std::memcpy(&f, &bits32, sizeof f);
    return f;
  }
};

// The packed layout of q, or null when the integer-dot kernels do not cover it (bits other than 4 or 8,
// columns not a multiple of 64, weights not on the CPU).
std::shared_ptr<const PackedQuant> pack_quantized(const QuantizedMatrix& q);

// y[M, N] for rows [row0, row0 + N) of the packed matrix; x is [M, cols] f32 row-major, y [M, N].
void linear_packed(const float* x, int64_t M, const PackedQuant& p, int64_t row0, int64_t N, float* y);

}  // namespace lathe::cpu
