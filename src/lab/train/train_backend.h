// What a training run needs from its base model: the loaded checkpoint (tokenizer, chat template, the linear
// sites LoRA attaches to) and the gradient engine over it.
//
// The gradient engine is the other half of [train] #19 (autograd over the frozen base, lora_engine_cpu.h):
// make_gradient_engine is the one place that picks it: CPU f32 (lora_engine_cpu.h) or CUDA f32
// (lora_engine_cuda.h).
#pragma once
#include <memory>
#include <string>

#include "engine/model_bundle.h"
#include "lab/train/lora_gradient.h"
#include "lab/train/train_data.h"
#include "lora/linear_sites.h"

namespace lathe::train {

struct TrainBackend {
  std::unique_ptr<ModelBundle> bundle;
  TextCodec codec;
  std::shared_ptr<const lora::LinearSites> sites;
};

// Loads the base checkpoint on the CPU (f32 compute; quantized weights stay packed).
TrainBackend open_backend(const std::string& model_dir);
// The tokenizer and chat template of a loaded model as the data loader wants them.
TextCodec codec_for(const ModelBundle& bundle);

bool gradient_engine_available();
// params must outlive the engine (it reads a / b and adds into grad_a / grad_b). Device::CUDA throws
// Error(Unsupported) where the build or the machine has no GPU.
std::unique_ptr<LoraGradientEngine> make_gradient_engine(TrainBackend& backend, LoraParams& params,
                                                         Device device = Device::CPU);
// "cpu" or "cuda" (a config's / flag's spelling); throws InvalidArgument otherwise.
Device training_device(const std::string& name);

}  // namespace lathe::train
