// One builder per architecture; the registry (model/registry.cc) maps model_type to these.
#pragma once
#include <memory>

#include "model/model.h"

namespace lathe::arch {

std::unique_ptr<Model> build_llama(ModelConfig config, Checkpoint ckpt);
std::unique_ptr<Model> build_qwen2(ModelConfig config, Checkpoint ckpt);
std::unique_ptr<Model> build_qwen3(ModelConfig config, Checkpoint ckpt);
std::unique_ptr<Model> build_gemma3(ModelConfig config, Checkpoint ckpt);
std::unique_ptr<Model> build_gemma4(ModelConfig config, Checkpoint ckpt);
std::unique_ptr<Model> build_qwen3_5(ModelConfig config, Checkpoint ckpt);

}  // namespace lathe::arch
