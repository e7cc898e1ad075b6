// The CPU f32 LoRA gradient engine (train::LoraGradientEngine) for dense decoders: llama / mistral, qwen2,
// qwen3, gemma3. It binds the loaded Model's checkpoint tensors (zero-copy; quantized weights stay packed)
// and mirrors DecoderModel's forward (src/model/decoder.cc) op for op on the autograd tape (autograd.h).
// Memory: per-layer gradient checkpointing. forward() keeps only each layer's input residual per sequence;
// backward() recomputes one layer's forward on a tape at a time, last layer first.
#pragma once
#include <memory>

#include "lab/train/lora_gradient.h"
#include "lora/adapter_file.h"
#include "model/model.h"

namespace lathe::train {

// Throws Error(Unsupported) for a model type it cannot train, a model not on the CPU, or a LoRA param on a
// module that is not one of the layer linears (q/k/v/o_proj, gate/up/down_proj of model.layers.N).
// `model` and `params` must outlive the engine; the engine reads params' a/b at every forward and adds to
// their grad_a/grad_b in backward (they must be F32, contiguous, with grads of the same shapes).
std::unique_ptr<LoraGradientEngine> make_cpu_lora_gradient_engine(const Model& model, LoraParams& params);

// Trainable params from an adapter (lora::LoraFactor a [r, in], b [out, r]; copies), grads zeroed.
LoraParams lora_params_from_adapter(const lora::AdapterWeights& adapter);
void zero_grads(LoraParams& params);

// Model types make_cpu_lora_gradient_engine accepts.
bool lora_training_supported(const std::string& model_type);

}  // namespace lathe::train
