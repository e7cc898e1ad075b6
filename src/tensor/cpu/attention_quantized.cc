// Attention over MLX affine-quantized K/V (quantized KV caches). The cache stays quantized; each call
// dequantizes the rows attention reads into f32 scratch (in parallel) and runs the f32 attention kernel, so
// quantized and unquantized caches share one softmax/masking implementation.
#include "tensor/cpu/kernels.h"
#include "tensor/thread_pool.h"

namespace lathe::cpu {
namespace {

Tensor dequantize_all(const QuantizedMatrix& m, int64_t kv_heads) {
  const int64_t rows = m.rows(), cols = m.cols();
  Tensor out = Tensor::empty({rows / kv_heads, kv_heads, cols}, DType::F32);
  float* o = out.data<float>();
  parallel_for(rows, 64, [&](int64_t r0, int64_t r1) { dequantize_rows(m, r0, r1 - r0, o + r0 * cols); });
  return out;
}

}  // namespace

void attention_quantized(const Tensor& q, const QuantizedMatrix& k, const QuantizedMatrix& v, int64_t kv_heads,
                         const AttentionParams& p, Tensor& out) {
  const Tensor kf = dequantize_all(k, kv_heads);
  const Tensor vf = dequantize_all(v, kv_heads);
  attention(q, kf, vf, p, out);
}

}  // namespace lathe::cpu
