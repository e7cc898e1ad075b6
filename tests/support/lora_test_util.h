// A random LoRA on all seven linear targets of every layer, for the training engine's tests.
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "lab/train/lora_gradient.h"
#include "model/config.h"
#include "tensor/tensor.h"

namespace lathe::train {

// Rank r factors: A ~ N(0, 1/in), B ~ N(0, 0.09) (non-zero, so every gradient path is exercised), scale 1.5.
inline LoraParams all_targets(const ModelConfig& c, int64_t r, uint32_t seed) {
  const char* sites[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                         "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
  const int64_t H = c.hidden_size, I = c.intermediate_size, qo = c.num_heads * c.head_dim,
                kvo = c.num_kv_heads * c.head_dim;
  const int64_t outs[] = {qo, kvo, kvo, H, I, I, H}, ins[] = {H, H, H, qo, H, H, I};
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  LoraParams ps;
  for (int64_t l = 0; l < c.num_layers; ++l)
    for (int s = 0; s < 7; ++s) {
      LoraParam p;
      p.module = "model.layers." + std::to_string(l) + "." + sites[s];
      std::vector<float> a(static_cast<size_t>(r * ins[s])), b(static_cast<size_t>(outs[s] * r));
      for (float& x : a) x = d(g) / std::sqrt(static_cast<float>(ins[s]));
      for (float& x : b) x = d(g) * 0.3f;
      p.a = Tensor::from_floats(a, {r, ins[s]});
      p.b = Tensor::from_floats(b, {outs[s], r});
      p.grad_a = Tensor::zeros(p.a.shape(), DType::F32);
      p.grad_b = Tensor::zeros(p.b.shape(), DType::F32);
      p.scale = 1.5f;
      ps.params.push_back(std::move(p));
    }
  return ps;
}

}  // namespace lathe::train
