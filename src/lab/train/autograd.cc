// Tape, raw f32 GEMM helpers and the pointwise / normalisation / rotary ops of the autograd (attention, linear
// and the loss head are in autograd_attention.cc and autograd_linear.cc).
#include "lab/train/autograd.h"

#include <cmath>

#include "common/error.h"
#include "tensor/thread_pool.h"

namespace lathe::train::ag {

void Tape::backward() {
  for (auto it = steps_.rbegin(); it != steps_.rend(); ++it) (*it)();
  steps_.clear();
}

Var make_var(int64_t rows, int64_t cols, bool requires_grad) {
  auto n = std::make_shared<Node>();
  n->rows = rows;
  n->cols = cols;
  n->value.assign(static_cast<size_t>(rows * cols), 0.0f);
  n->requires_grad = requires_grad;
  return n;
}

Var from_values(std::vector<float> values, int64_t rows, int64_t cols, bool requires_grad) {
  LATHE_CHECK(static_cast<int64_t>(values.size()) == rows * cols, "from_values: size mismatch");
  auto n = std::make_shared<Node>();
  n->rows = rows;
  n->cols = cols;
  n->value = std::move(values);
  n->requires_grad = requires_grad;
  return n;
}

void gemm_nt(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k, bool accumulate) {
  parallel_for(m, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const float* ar = a + i * k;
        const float* br = b + j * k;
        float s = 0.0f;
        for (int64_t x = 0; x < k; ++x) s += ar[x] * br[x];
        c[i * n + j] = accumulate ? c[i * n + j] + s : s;
      }
  });
}

namespace {

// c[m, n] (+)= a · b with b [k, n] row-major and a's element (i, x) at a[i * row_stride + x * col_stride]: one
// loop for a as given (gemm_nn) and for a transposed (gemm_tn).
void gemm_strided_a(const float* a, int64_t row_stride, int64_t col_stride, const float* b, float* c, int64_t m,
                    int64_t n, int64_t k, bool accumulate) {
  parallel_for(m, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      float* cr = c + i * n;
      if (!accumulate)
        for (int64_t j = 0; j < n; ++j) cr[j] = 0.0f;
      for (int64_t x = 0; x < k; ++x) {
        const float av = a[i * row_stride + x * col_stride];
        const float* br = b + x * n;
        for (int64_t j = 0; j < n; ++j) cr[j] += av * br[j];
      }
    }
  });
}

}  // namespace

void gemm_nn(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k, bool accumulate) {
  gemm_strided_a(a, k, 1, b, c, m, n, k, accumulate);
}

void gemm_tn(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k, bool accumulate) {
  gemm_strided_a(a, 1, m, b, c, m, n, k, accumulate);
}

Var add(Tape& t, const Var& a, const Var& b) {
  LATHE_CHECK(a->rows == b->rows && a->cols == b->cols, "ag::add: shape mismatch");
  Var y = make_var(a->rows, a->cols, a->requires_grad || b->requires_grad);
  for (size_t i = 0; i < y->value.size(); ++i) y->value[i] = a->value[i] + b->value[i];
  if (y->requires_grad)
    t.record([a, b, y] {
      for (const Var& in : {a, b})
        if (in->requires_grad) {
          float* g = in->g();
          for (size_t i = 0; i < y->grad.size(); ++i) g[i] += y->grad[i];
        }
    });
  return y;
}

Var scale(Tape& t, const Var& x, float s) {
  Var y = make_var(x->rows, x->cols, x->requires_grad);
  for (size_t i = 0; i < y->value.size(); ++i) y->value[i] = x->value[i] * s;
  if (y->requires_grad)
    t.record([x, y, s] {
      float* g = x->g();
      for (size_t i = 0; i < y->grad.size(); ++i) g[i] += y->grad[i] * s;
    });
  return y;
}

Var embedding(Tape&, const std::vector<int32_t>& ids, const Weight& table) {
  const Tensor rows = lathe::embedding(ids, table);  // F32 [n, dim] on the CPU
  const int64_t dim = rows.dim(1);
  Var y = make_var(static_cast<int64_t>(ids.size()), dim, false);
  const Tensor c = rows.contiguous();
  std::copy(c.data<float>(), c.data<float>() + y->value.size(), y->value.begin());
  return y;
}

Var rms_norm(Tape& t, const Var& x, const Tensor& weight, float eps, bool plus_one, int64_t group) {
  LATHE_CHECK(group > 0 && x->cols % group == 0, "ag::rms_norm: group does not divide the row");
  const int64_t groups = x->rows * (x->cols / group);
  std::vector<float> w(static_cast<size_t>(group), 1.0f);
  if (weight.defined()) {
    const std::vector<float> wf = weight.to_floats();
    LATHE_CHECK(static_cast<int64_t>(wf.size()) == group, "ag::rms_norm: weight size");
    for (int64_t i = 0; i < group; ++i)
      w[static_cast<size_t>(i)] = plus_one ? 1.0f + wf[static_cast<size_t>(i)] : wf[static_cast<size_t>(i)];
  }
  Var y = make_var(x->rows, x->cols, x->requires_grad);
  auto inv = std::make_shared<std::vector<float>>(static_cast<size_t>(groups));
  for (int64_t r = 0; r < groups; ++r) {
    const float* xr = x->v() + r * group;
    float ss = 0.0f;
    for (int64_t i = 0; i < group; ++i) ss += xr[i] * xr[i];
    const float iv = 1.0f / std::sqrt(ss / static_cast<float>(group) + eps);
    (*inv)[static_cast<size_t>(r)] = iv;
    float* yr = y->value.data() + r * group;
    for (int64_t i = 0; i < group; ++i) yr[i] = xr[i] * iv * w[static_cast<size_t>(i)];
  }
  if (y->requires_grad)
    t.record([x, y, inv, w = std::move(w), group, groups] {
      float* gx = x->g();
      for (int64_t r = 0; r < groups; ++r) {
        const float* xr = x->v() + r * group;
        const float* gy = y->grad.data() + r * group;
        const float iv = (*inv)[static_cast<size_t>(r)];
        // y = x * iv * w with iv = (mean(x²) + eps)^-1/2: dx = iv * gy * w - x * iv³ / n * Σ gy * w * x.
        float dot = 0.0f;
        for (int64_t i = 0; i < group; ++i) dot += gy[i] * w[static_cast<size_t>(i)] * xr[i];
        const float c = iv * iv * iv * dot / static_cast<float>(group);
        float* gr = gx + r * group;
        for (int64_t i = 0; i < group; ++i) gr[i] += iv * gy[i] * w[static_cast<size_t>(i)] - xr[i] * c;
      }
    });
  return y;
}

Var rope(Tape& t, const Var& x, const RopeTable& table, int64_t head_dim, const std::vector<int64_t>& positions) {
  LATHE_CHECK(x->cols % head_dim == 0 && static_cast<int64_t>(positions.size()) == x->rows, "ag::rope: shapes");
  const int64_t T = x->rows, H = x->cols / head_dim, half = table.dims / 2;
  auto cs = std::make_shared<std::vector<float>>(static_cast<size_t>(T * half * 2));
  for (int64_t r = 0; r < T; ++r) {
    const float pos = static_cast<float>(positions[static_cast<size_t>(r)]);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = pos * table.inv_freq[static_cast<size_t>(i)];
      (*cs)[static_cast<size_t>((r * half + i) * 2)] = std::cos(angle) * table.attention_scaling;
      (*cs)[static_cast<size_t>((r * half + i) * 2 + 1)] = std::sin(angle) * table.attention_scaling;
    }
  }
  Var y = make_var(x->rows, x->cols, x->requires_grad);
  y->value = x->value;
  for (int64_t r = 0; r < T; ++r)
    for (int64_t h = 0; h < H; ++h) {
      float* v = y->value.data() + r * x->cols + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float c = (*cs)[static_cast<size_t>((r * half + i) * 2)],
                    s = (*cs)[static_cast<size_t>((r * half + i) * 2 + 1)];
        const float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
      }
    }
  if (y->requires_grad)
    t.record([x, y, cs, T, H, half, head_dim] {
      float* gx = x->g();
      for (int64_t r = 0; r < T; ++r)
        for (int64_t h = 0; h < H; ++h) {
          const int64_t base = r * x->cols + h * head_dim;
          const float* gy = y->grad.data() + base;
          float* g = gx + base;
          for (int64_t i = 0; i < half; ++i) {  // the transpose of the rotation
            const float c = (*cs)[static_cast<size_t>((r * half + i) * 2)],
                        s = (*cs)[static_cast<size_t>((r * half + i) * 2 + 1)];
            g[i] += gy[i] * c + gy[i + half] * s;
            g[i + half] += gy[i + half] * c - gy[i] * s;
          }
          for (int64_t i = 2 * half; i < head_dim; ++i) g[i] += gy[i];  // unrotated tail (partial rotary)
        }
    });
  return y;
}

namespace {
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
}

Var gated(Tape& t, const Var& gate, const Var& up, Gate act) {
  LATHE_CHECK(gate->rows == up->rows && gate->cols == up->cols, "ag::gated: shape mismatch");
  Var y = make_var(gate->rows, gate->cols, gate->requires_grad || up->requires_grad);
  const size_t n = y->value.size();
  for (size_t i = 0; i < n; ++i) {
    const float g = gate->value[i];
    float a;
    if (act == Gate::SiLU) {
      a = g / (1.0f + std::exp(-g));
    } else {
      a = 0.5f * g * (1.0f + std::tanh(kGeluC * (g + 0.044715f * g * g * g)));
    }
    y->value[i] = a * up->value[i];
  }
  if (y->requires_grad)
    t.record([gate, up, y, act, n] {
      float* gg = gate->requires_grad ? gate->g() : nullptr;
      float* gu = up->requires_grad ? up->g() : nullptr;
      for (size_t i = 0; i < n; ++i) {
        const float g = gate->value[i];
        float a, da;
        if (act == Gate::SiLU) {
          const float s = 1.0f / (1.0f + std::exp(-g));
          a = g * s;
          da = s * (1.0f + g * (1.0f - s));
        } else {
          const float th = std::tanh(kGeluC * (g + 0.044715f * g * g * g));
          a = 0.5f * g * (1.0f + th);
          da = 0.5f * (1.0f + th) + 0.5f * g * (1.0f - th * th) * kGeluC * (1.0f + 3.0f * 0.044715f * g * g);
        }
        if (gg) gg[i] += y->grad[i] * up->value[i] * da;
        if (gu) gu[i] += y->grad[i] * a;
      }
    });
  return y;
}

}  // namespace lathe::train::ag
