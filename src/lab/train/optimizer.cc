#include "lab/train/optimizer.h"

#include <cmath>
#include <cstring>
#include <string>

#include "common/error.h"

namespace lathe::train {
namespace {

template <class F>
void for_each_tensor(LoraParams& params, F f) {
  size_t k = 0;
  for (auto& p : params.params) {
    f(k++, p.a, p.grad_a);
    f(k++, p.b, p.grad_b);
  }
}

}  // namespace

AdamW::AdamW(const LoraParams& params, AdamWOptions options) : o_(options) {
  if (!std::isfinite(o_.lora_plus_ratio) || o_.lora_plus_ratio <= 0)
    throw Error(ErrorKind::InvalidArgument,
                "lora_plus_ratio must be a finite number > 0 (got " + std::to_string(o_.lora_plus_ratio) + ")");
  for (const auto& p : params.params) {
    m_.emplace_back(static_cast<size_t>(p.a.numel()), 0.0f);
    m_.emplace_back(static_cast<size_t>(p.b.numel()), 0.0f);
  }
  v_ = m_;
}

void AdamW::step(LoraParams& params, double lr) {
  ++t_;
  const double bc1 = 1.0 - std::pow(o_.beta1, static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(o_.beta2, static_cast<double>(t_));
  const float b1 = static_cast<float>(o_.beta1), b2 = static_cast<float>(o_.beta2);
  const float inv_bc2 = static_cast<float>(1.0 / bc2);
  const float eps = static_cast<float>(o_.eps);
  for_each_tensor(params, [&](size_t k, Tensor& w, Tensor& g) {
    LATHE_CHECK(m_[k].size() == static_cast<size_t>(w.numel()), "optimizer state does not fit the parameters");
    // Odd k is a B matrix (a0, b0, a1, b1, ...): its group's lr, decay included, is the LoRA+ multiple.
    const double group_lr = k % 2 == 1 ? lr * o_.lora_plus_ratio : lr;
    const float decay = static_cast<float>(1.0 - group_lr * o_.weight_decay);
    const float step = static_cast<float>(group_lr / bc1);
    float* p = w.data<float>();
    const float* gr = g.data<float>();
    float* m = m_[k].data();
    float* v = v_[k].data();
    for (size_t i = 0; i < m_[k].size(); ++i) {
      p[i] *= decay;
      m[i] = b1 * m[i] + (1.0f - b1) * gr[i];
      v[i] = b2 * v[i] + (1.0f - b2) * gr[i] * gr[i];
      p[i] -= step * m[i] / (std::sqrt(v[i] * inv_bc2) + eps);
    }
  });
}

double global_grad_norm(const LoraParams& params) {
  double s = 0;
  for (const auto& p : params.params)
    for (const Tensor* g : {&p.grad_a, &p.grad_b}) {
      const float* d = g->data<float>();
      for (int64_t i = 0; i < g->numel(); ++i) s += static_cast<double>(d[i]) * d[i];
    }
  return std::sqrt(s);
}

void scale_grads(LoraParams& params, double factor) {
  const float f = static_cast<float>(factor);
  for (auto& p : params.params)
    for (Tensor* g : {&p.grad_a, &p.grad_b}) {
      float* d = g->data<float>();
      for (int64_t i = 0; i < g->numel(); ++i) d[i] *= f;
    }
}

double clip_grad_norm(LoraParams& params, double max_norm) {
  const double norm = global_grad_norm(params);
  if (max_norm > 0 && norm > max_norm) scale_grads(params, max_norm / norm);
  return norm;
}

void clear_grads(LoraParams& params) {
  for (auto& p : params.params)
    for (Tensor* g : {&p.grad_a, &p.grad_b}) std::memset(g->raw(), 0, g->nbytes());
}

}  // namespace lathe::train
