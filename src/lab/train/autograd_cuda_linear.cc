// The CUDA autograd's ops through frozen weights (linear, the loss head) and the trainable LoRA residual. A frozen
// weight is read a block of rows at a time as f32: in place when the device copy is already contiguous f32, else
// dequantized (packed MLX weights stay packed) or widened into scratch that returns to the allocator's cache.
#ifdef LATHE_HAVE_CUDA
#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "lab/train/autograd_cuda.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/train_kernels.h"
#include "tensor/ops_cuda_check.h"

namespace lathe::train::dg {
namespace tk = lathe::cuda::train;
namespace {

constexpr int64_t kScratchFloats = int64_t{16} << 20;  // at most 64 MiB of weight rows widened at once

// Rows per block of a weight with `in` columns: the whole weight when it is already f32 on the device.
int64_t block_rows(const Weight& w) {
  if (!w.quantized && w.dense.dtype() == DType::F32 && w.dense.is_contiguous()) return w.out_features();
  return std::max<int64_t>(1, kScratchFloats / std::max<int64_t>(1, w.in_features()));
}

// Rows [r0, r0 + n) of w as f32 [n, in] on the device: a pointer into w itself, or into `scratch`.
const float* weight_block(const Weight& w, int64_t r0, int64_t n, Tensor& scratch) {
  const int64_t in = w.in_features();
  if (w.quantized) {
    LATHE_CHECK(w.q.w.device() == Device::CUDA, "dg: a frozen weight is not on the device");
    scratch = Tensor::empty({n, in}, DType::F32, Device::CUDA);
    cuda::dequantize(gpu::view(w.q), r0, n, scratch.raw(), DType::F32);
    return scratch.data<float>();
  }
  LATHE_CHECK(w.dense.device() == Device::CUDA && w.dense.is_contiguous(), "dg: a frozen weight is not on the device");
  if (w.dense.dtype() == DType::F32) return w.dense.data<float>() + r0 * in;
  scratch = Tensor::empty({n, in}, DType::F32, Device::CUDA);
  const char* base =
      static_cast<const char*>(w.dense.raw()) + r0 * in * static_cast<int64_t>(dtype_size(w.dense.dtype()));
  cuda::convert(base, w.dense.dtype(), scratch.raw(), DType::F32, n * in);
  return scratch.data<float>();
}

// gx[T, in] += gy[T, out] · W, a block of W's rows at a time.
void add_dy_times_w(const float* gy, int64_t T, const Weight& w, float* gx) {
  const int64_t out = w.out_features(), in = w.in_features(), step = block_rows(w);
  Tensor scratch;
  for (int64_t r0 = 0; r0 < out; r0 += step) {
    const int64_t n = std::min(step, out - r0);
    const float* wb = weight_block(w, r0, n, scratch);
    tk::sgemm(false, false, T, in, n, 1.0f, gy + r0, out, wb, in, 1.0f, gx, in);
  }
}

}  // namespace

Var linear(Tape& t, const Var& x, const Weight& w, const Tensor* bias) {
  LATHE_CHECK(x->cols == w.in_features(), "dg::linear: input width does not match the weight");
  const int64_t T = x->rows, out = w.out_features(), in = w.in_features(), step = block_rows(w);
  Var y = make_var(T, out, x->requires_grad);
  Tensor scratch;
  for (int64_t r0 = 0; r0 < out; r0 += step) {  // y[:, r0 : r0 + n] = x · W[r0 : r0 + n]ᵀ
    const int64_t n = std::min(step, out - r0);
    const float* wb = weight_block(w, r0, n, scratch);
    tk::sgemm(false, true, T, n, in, 1.0f, x->v(), in, wb, in, 0.0f, y->mv() + r0, out);
  }
  if (bias && bias->defined()) {
    LATHE_CHECK(bias->device() == Device::CUDA && bias->dtype() == DType::F32 && bias->numel() == out,
                "dg::linear: the bias must be F32 [out] on the device");
    cuda::add_bias(y->mv(), DType::F32, T, out, bias->data<float>());
  }
  if (y->requires_grad)
    t.record([x, y, &w] {
      if (const float* gy = y->gy()) add_dy_times_w(gy, x->rows, w, x->g());
    });
  return y;
}

Var lora(Tape& t, const Var& x, DeviceLora& p) {
  const int64_t T = x->rows, r = p.a.dim(0), in = p.a.dim(1), out = p.b.dim(0);
  LATHE_CHECK(x->cols == in && p.b.dim(1) == r, "dg::lora: shapes");
  Tensor u = Tensor::empty({T, r}, DType::F32, Device::CUDA);
  tk::sgemm(false, true, T, r, in, 1.0f, x->v(), in, p.a.data<float>(), in, 0.0f, u.data<float>(), r);  // u = x·aᵀ
  Var y = make_var(T, out, true);
  tk::sgemm(false, true, T, out, r, p.scale, u.data<float>(), r, p.b.data<float>(), r, 0.0f, y->mv(), out);
  t.record([x, y, u, &p, T, r, in, out] {
    const float* gy = y->gy();
    if (!gy) return;
    const float s = p.scale;
    // db += s · gyᵀ · u; du = s · gy · b; da += duᵀ · x; dx += du · a.
    tk::sgemm(true, false, out, r, T, s, gy, out, u.data<float>(), r, 1.0f, p.grad_b.data<float>(), r);
    Tensor du = Tensor::empty({T, r}, DType::F32, Device::CUDA);
    tk::sgemm(false, false, T, r, out, s, gy, out, p.b.data<float>(), r, 0.0f, du.data<float>(), r);
    tk::sgemm(true, false, r, in, T, 1.0f, du.data<float>(), r, x->v(), in, 1.0f, p.grad_a.data<float>(), in);
    if (x->requires_grad)
      tk::sgemm(false, false, T, in, r, 1.0f, du.data<float>(), r, p.a.data<float>(), in, 1.0f, x->g(), in);
  });
  return y;
}

Var target_logprobs(Tape& t, const Var& h, const Weight& head, const std::vector<int32_t>& targets, float cap,
                    int64_t chunk) {
  const int64_t T = h->rows, V = head.out_features(), H = h->cols;
  LATHE_CHECK(H == head.in_features() && static_cast<int64_t>(targets.size()) == T, "dg::target_logprobs");
  for (int32_t id : targets)
    if (id >= V) throw Error(ErrorKind::InvalidArgument, "target token " + std::to_string(id) + " >= vocab size");
  chunk = std::max<int64_t>(1, std::min(chunk, V));
  const Tensor ids = Tensor::from_ints(targets, {T}).to(Device::CUDA);
  // Logits of every row against vocabulary rows [v0, v0 + n) into z [T, n].
  auto block_logits = [h, &head, T, H](int64_t v0, int64_t n, Tensor& z, Tensor& scratch) {
    const float* wb = weight_block(head, v0, n, scratch);
    tk::sgemm(false, true, T, n, H, 1.0f, h->v(), H, wb, H, 0.0f, z.data<float>(), n);
    return wb;
  };
  Tensor m = Tensor::empty({T}, DType::F32, Device::CUDA), s = Tensor::zeros({T}, DType::F32, Device::CUDA),
         tgt = Tensor::zeros({T}, DType::F32, Device::CUDA), lse = Tensor::empty({T}, DType::F32, Device::CUDA);
  tk::fill(m.data<float>(), T, -INFINITY);
  Tensor z = Tensor::empty({T, chunk}, DType::F32, Device::CUDA), scratch;
  for (int64_t v0 = 0; v0 < V; v0 += chunk) {
    const int64_t n = std::min(chunk, V - v0);
    block_logits(v0, n, z, scratch);
    tk::logprob_block(z.data<float>(), T, n, v0, cap, ids.data<int32_t>(), m.data<float>(), s.data<float>(),
                      tgt.data<float>());
  }
  Var y = make_var(T, 1, h->requires_grad);
  tk::logprob_finish(m.data<float>(), s.data<float>(), tgt.data<float>(), ids.data<int32_t>(), T, lse.data<float>(),
                     y->mv());
  if (y->requires_grad)
    t.record([h, y, ids, lse, block_logits, &head, T, V, H, cap, chunk] {
      const float* gy = y->gy();
      if (!gy) return;
      Tensor z = Tensor::empty({T, chunk}, DType::F32, Device::CUDA), scratch;
      for (int64_t v0 = 0; v0 < V; v0 += chunk) {
        const int64_t n = std::min(chunk, V - v0);
        const float* wb = block_logits(v0, n, z, scratch);
        tk::logprob_block_backward(z.data<float>(), T, n, v0, cap, ids.data<int32_t>(), lse.data<float>(), gy);
        tk::sgemm(false, false, T, H, n, 1.0f, z.data<float>(), n, wb, H, 1.0f, h->g(), H);  // dh += dz · W_block
      }
    });
  return y;
}

}  // namespace lathe::train::dg
#endif
