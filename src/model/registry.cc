// model_type -> architecture builder. Aliases follow mlx-lm's remapping (mistral -> llama, gemma3_text -> gemma3,
// gemma4_text -> gemma4, qwen3_5_text -> qwen3_5).
#include <functional>
#include <map>

#include "common/error.h"
#include "model/arch/archs.h"
#include "model/model.h"

namespace lathe {
namespace {

using Builder = std::function<std::unique_ptr<Model>(ModelConfig, Checkpoint)>;

const std::map<std::string, Builder>& builders() {
  static const std::map<std::string, Builder> m = {
      {"llama", arch::build_llama},          {"mistral", arch::build_llama},      {"qwen2", arch::build_qwen2},
      {"qwen3", arch::build_qwen3},          {"gemma3", arch::build_gemma3},      {"gemma3_text", arch::build_gemma3},
      {"gemma4", arch::build_gemma4},        {"gemma4_text", arch::build_gemma4}, {"qwen3_5", arch::build_qwen3_5},
      {"qwen3_5_text", arch::build_qwen3_5},
  };
  return m;
}

}  // namespace

std::vector<std::string> supported_model_types() {
  std::vector<std::string> out;
  for (const auto& [k, v] : builders()) out.push_back(k);
  return out;
}

std::unique_ptr<Model> load_model(const std::string& dir, const LoadOptions& options) {
  if (options.device == Device::CPU && options.dtype != DType::F32)
    throw Error(ErrorKind::Unsupported,
                std::string("the cpu computes in F32; --dtype ") + dtype_name(options.dtype) + " needs --device cuda");
  if (options.dtype != DType::F32 && options.dtype != DType::BF16)
    throw Error(ErrorKind::Unsupported, std::string("activation type ") + dtype_name(options.dtype) + " (F32 or BF16)");
  ModelConfig config = load_model_config(dir);
  config.load = options;
  auto it = builders().find(config.model_type);
  if (it == builders().end()) {
    std::string list;
    for (const auto& t : supported_model_types()) list += (list.empty() ? "" : ", ") + t;
    throw Error(ErrorKind::Unsupported,
                dir + "/config.json: unknown model_type '" + config.model_type + "' (supported: " + list + ")");
  }
  Checkpoint ckpt = Checkpoint::open(dir);
  return it->second(std::move(config), std::move(ckpt));
}

}  // namespace lathe
