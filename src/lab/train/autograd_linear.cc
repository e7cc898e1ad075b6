// Ops through frozen weights (linear, the loss head) and the trainable LoRA residual. The forward matmul is the
// inference kernel (lathe::linear; exact f32 when the weight is bound without CPU repacking); backward walks
// the weight a block of rows at a time, dequantized / widened to f32 only for that block.
#include <algorithm>
#include <cmath>
#include <limits>

#include "common/error.h"
#include "lab/train/autograd.h"

namespace lathe::train::ag {
namespace {

constexpr int64_t kRowBlock = 512;  // weight rows dequantized at once in backward

// A CPU tensor viewing a Var's values without a copy (kept alive by the Var).
Tensor view(const Var& x) {
  return Tensor::alias(const_cast<float*>(x->v()), {x->rows, x->cols}, DType::F32, std::shared_ptr<void>(x));
}

void copy_out(const Tensor& src, std::vector<float>& dst) {
  const Tensor c = src.contiguous();
  LATHE_CHECK(c.dtype() == DType::F32 && static_cast<size_t>(c.numel()) == dst.size(), "ag: unexpected output");
  std::copy(c.data<float>(), c.data<float>() + dst.size(), dst.begin());
}

// gx[T, in] += gy[T, out] · W: one block of W's rows at a time, through the dense kernel on Wcᵀ.
void add_dy_times_w(const float* gy, int64_t T, const Weight& w, float* gx) {
  const int64_t out = w.out_features(), in = w.in_features();
  for (int64_t r0 = 0; r0 < out; r0 += kRowBlock) {
    const int64_t n = std::min(kRowBlock, out - r0);
    Weight wt;
    wt.dense = weight_rows(w, r0, n).transpose(0, 1).contiguous();  // [in, n]
    Tensor gyb = Tensor::empty({T, n}, DType::F32);
    for (int64_t i = 0; i < T; ++i) std::copy(gy + i * out + r0, gy + i * out + r0 + n, gyb.data<float>() + i * n);
    const Tensor part = lathe::linear(gyb, wt).contiguous();  // [T, in]
    const float* pp = part.data<float>();
    for (int64_t i = 0; i < T * in; ++i) gx[i] += pp[i];
  }
}

}  // namespace

Tensor weight_rows(const Weight& w, int64_t row0, int64_t n) {
  if (w.quantized) return dequantize(w.q, row0, n);
  return w.dense.slice(0, row0, row0 + n).to(DType::F32).contiguous();
}

Var linear(Tape& t, const Var& x, const Weight& w, const Tensor* bias) {
  LATHE_CHECK(x->cols == w.in_features(), "ag::linear: input width does not match the weight");
  Var y = make_var(x->rows, w.out_features(), x->requires_grad);
  copy_out(lathe::linear(view(x), w, bias), y->value);
  if (y->requires_grad) t.record([x, y, &w] { add_dy_times_w(y->grad.data(), x->rows, w, x->g()); });
  return y;
}

Var masked(Tape& t, const Var& x, std::shared_ptr<const std::vector<float>> mask) {
  LATHE_CHECK(mask && mask->size() == x->value.size(), "ag::masked: the mask does not cover the input");
  Var y = make_var(x->rows, x->cols, x->requires_grad);
  for (size_t i = 0; i < y->value.size(); ++i) y->value[i] = x->value[i] * (*mask)[i];
  if (y->requires_grad)
    t.record([x, y, mask] {
      float* gx = x->g();
      for (size_t i = 0; i < y->grad.size(); ++i) gx[i] += y->grad[i] * (*mask)[i];
    });
  return y;
}

Var lora(Tape& t, const Var& x, LoraParam& p) {
  const int64_t T = x->rows, r = p.a.dim(0), in = p.a.dim(1), out = p.b.dim(0);
  LATHE_CHECK(x->cols == in && p.b.dim(1) == r, "ag::lora: shapes of " + p.module);
  auto u = std::make_shared<std::vector<float>>(static_cast<size_t>(T * r));
  gemm_nt(x->v(), p.a.data<float>(), u->data(), T, r, in, false);  // u = x · aᵀ
  Var y = make_var(T, out, true);
  gemm_nt(u->data(), p.b.data<float>(), y->value.data(), T, out, r, false);  // y = u · bᵀ
  for (float& v : y->value) v *= p.scale;
  t.record([x, y, u, &p, T, r, in, out] {
    std::vector<float> gys(y->grad.size());
    for (size_t i = 0; i < gys.size(); ++i) gys[i] = y->grad[i] * p.scale;
    gemm_tn(gys.data(), u->data(), p.grad_b.data<float>(), out, r, T, true);  // db += (s·gy)ᵀ · u
    std::vector<float> gu(static_cast<size_t>(T * r));
    gemm_nn(gys.data(), p.b.data<float>(), gu.data(), T, r, out, false);                  // du = (s·gy) · b
    gemm_tn(gu.data(), x->v(), p.grad_a.data<float>(), r, in, T, true);                   // da += duᵀ · x
    if (x->requires_grad) gemm_nn(gu.data(), p.a.data<float>(), x->g(), T, in, r, true);  // dx += du · a
  });
  return y;
}

Var target_logprobs(Tape& t, const Var& h, const Weight& head, const std::vector<int32_t>& targets, float cap,
                    int64_t chunk) {
  const int64_t T = h->rows, V = head.out_features();
  LATHE_CHECK(h->cols == head.in_features() && static_cast<int64_t>(targets.size()) == T, "ag::target_logprobs");
  for (int32_t id : targets)
    if (id >= V) throw Error(ErrorKind::InvalidArgument, "target token " + std::to_string(id) + " >= vocab size");
  // Logits of all rows against one block of vocabulary rows: [T, n], softcapped; th keeps tanh for backward.
  auto block_logits = [h, &head, T, cap](int64_t v0, int64_t n, std::vector<float>* th) {
    Weight wb;
    wb.dense = weight_rows(head, v0, n);
    Tensor z = lathe::linear(view(h), wb).contiguous();
    float* zp = z.data<float>();
    if (cap > 0) {
      if (th) th->resize(static_cast<size_t>(T * n));
      for (int64_t i = 0; i < T * n; ++i) {
        const float tt = std::tanh(zp[i] / cap);
        if (th) (*th)[static_cast<size_t>(i)] = tt;
        zp[i] = tt * cap;
      }
    }
    return z;
  };
  // Online log-sum-exp over vocabulary blocks; the target's logit is picked up in its block.
  auto lse = std::make_shared<std::vector<float>>(static_cast<size_t>(T), -std::numeric_limits<float>::infinity());
  std::vector<float> sum(static_cast<size_t>(T), 0.0f), tgt(static_cast<size_t>(T), 0.0f);
  for (int64_t v0 = 0; v0 < V; v0 += chunk) {
    const int64_t n = std::min(chunk, V - v0);
    const Tensor z = block_logits(v0, n, nullptr);
    const float* zp = z.data<float>();
    for (int64_t i = 0; i < T; ++i) {
      const float* zr = zp + i * n;
      float& m = (*lse)[static_cast<size_t>(i)];
      const float bm = *std::max_element(zr, zr + n);
      if (bm > m) {
        sum[static_cast<size_t>(i)] *= std::exp(m - bm);
        m = bm;
      }
      for (int64_t j = 0; j < n; ++j) sum[static_cast<size_t>(i)] += std::exp(zr[j] - m);
      const int32_t id = targets[static_cast<size_t>(i)];
      if (id >= v0 && id < v0 + n) tgt[static_cast<size_t>(i)] = zr[id - v0];
    }
  }
  Var y = make_var(T, 1, h->requires_grad);
  for (int64_t i = 0; i < T; ++i) {
    (*lse)[static_cast<size_t>(i)] += std::log(sum[static_cast<size_t>(i)]);
    if (targets[static_cast<size_t>(i)] >= 0)
      y->value[static_cast<size_t>(i)] = tgt[static_cast<size_t>(i)] - (*lse)[static_cast<size_t>(i)];
  }
  if (y->requires_grad)
    t.record([h, y, lse, targets, block_logits, &head, T, V, cap, chunk] {
      float* gh = h->g();
      std::vector<float> th;
      for (int64_t v0 = 0; v0 < V; v0 += chunk) {
        const int64_t n = std::min(chunk, V - v0);
        Tensor z = block_logits(v0, n, &th);
        float* dz = z.data<float>();  // becomes d/dlogit in place
        for (int64_t i = 0; i < T; ++i) {
          const int32_t id = targets[static_cast<size_t>(i)];
          const float gi = id >= 0 ? y->grad[static_cast<size_t>(i)] : 0.0f;
          float* zr = dz + i * n;
          for (int64_t j = 0; j < n; ++j) {
            // d logp_target / d z_j = [j == target] - softmax_j
            float d = -std::exp(zr[j] - (*lse)[static_cast<size_t>(i)]);
            if (v0 + j == id) d += 1.0f;
            d *= gi;
            if (cap > 0) {
              const float tt = th[static_cast<size_t>(i * n + j)];
              d *= 1.0f - tt * tt;
            }
            zr[j] = d;
          }
        }
        Weight wt;
        wt.dense = weight_rows(head, v0, n).transpose(0, 1).contiguous();  // [H, n]
        const Tensor part = lathe::linear(z, wt).contiguous();             // [T, H]
        const float* pp = part.data<float>();
        for (int64_t i = 0; i < T * h->cols; ++i) gh[i] += pp[i];
      }
    });
  return y;
}

}  // namespace lathe::train::ag
