// The CUDA f32 LoRA gradient engine (train::LoraGradientEngine) for the dense decoders the CPU engine trains
// (llama / mistral, qwen2, qwen3, gemma3): the same forward, op for op, on the CUDA autograd (autograd_cuda.h),
// with the same per-layer gradient checkpointing. It binds its own device copy of the checkpoint's frozen
// weights (quantized ones stay packed; dense ones as f32), whatever device the Model was loaded on. The LoRA
// factors are uploaded at every forward with the adapter; backward adds the gradients into the params' host
// grad_a / grad_b, so the trainer and its optimizer see the same contract as with the CPU engine.
#pragma once
#include <memory>

#include "lab/train/lora_gradient.h"
#include "model/model.h"

namespace lathe::train {

// Whether this build has the CUDA engine and a device to run it on.
bool cuda_training_available();
// Throws Error(Unsupported) without a CUDA build or device, or for a model the engines cannot train; other
// errors as make_cpu_lora_gradient_engine. `model` and `params` must outlive the engine.
struct CudaEngineOptions {
  // Matmuls on bf16 tensor cores (f32 accumulation, f32 activations and master weights): the speed mode, outside
  // the f32 parity bounds. Off: plain f32.
  bool bf16_matmul = false;
};
std::unique_ptr<LoraGradientEngine> make_cuda_lora_gradient_engine(const Model& model, LoraParams& params,
                                                                   const CudaEngineOptions& options = {});

}  // namespace lathe::train
