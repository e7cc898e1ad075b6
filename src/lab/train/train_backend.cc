#include "lab/train/train_backend.h"

#include "common/error.h"
#include "lab/train/lora_engine_cpu.h"
#include "lab/train/lora_engine_cuda.h"

namespace lathe::train {

TextCodec codec_for(const ModelBundle& bundle) {
  TextCodec c;
  const ModelBundle* b = &bundle;
  c.encode = [b](const std::string& text) { return b->text_prompt(text); };
  if (const ChatTemplate* t = bundle.chat_template())
    c.render = [t](const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                   bool add_generation_prompt) {
      ChatTemplateInput in;
      in.messages = messages;
      in.tools = tools;
      in.add_generation_prompt = add_generation_prompt;
      return t->render(in);
    };
  c.bos_id = bundle.tokenizer().bos_id().value_or(-1);
  return c;
}

TrainBackend open_backend(const std::string& model_dir) {
  TrainBackend b;
  LoadOptions load;
  load.device = Device::CPU;
  load.dtype = DType::F32;
  load.exact = true;  // training differentiates the exact dequantized matmul, not the int8-activation kernels
  b.bundle = std::make_unique<ModelBundle>(model_dir, load);
  b.codec = codec_for(*b.bundle);
  b.sites = b.bundle->model().linear_sites();
  if (!b.sites || b.sites->size() == 0)
    throw Error(ErrorKind::Unsupported, "the model in " + model_dir + " has no linear layers LoRA can attach to");
  return b;
}

bool gradient_engine_available() { return true; }

std::unique_ptr<LoraGradientEngine> make_gradient_engine(TrainBackend& backend, LoraParams& params, Device device) {
  // The model stays loaded on the CPU (mapped, zero-copy); the CUDA engine uploads its own f32 / packed copy.
  if (device == Device::CUDA) return make_cuda_lora_gradient_engine(backend.bundle->model(), params);
  return make_cpu_lora_gradient_engine(backend.bundle->model(), params);
}

Device training_device(const std::string& name) {
  if (name == "cpu") return Device::CPU;
  if (name == "cuda") return Device::CUDA;
  throw Error(ErrorKind::InvalidArgument, "device must be cpu or cuda (got '" + name + "')");
}

}  // namespace lathe::train
