#include "lab/train/finetune_job.h"

#include "common/error.h"
#include "jobs/stop_request.h"
#include "lab/train/lora_engine_cpu.h"
#include "lab/train/lora_engine_cuda.h"
#include "lab/train/lora_init.h"
#include "lab/train/train_backend.h"
#include "lab/train/train_data.h"
#include "lab/train/trainer.h"
#include "model/config.h"

namespace lathe::lab {

jobs::JobResult run_finetune(const train::TrainConfig& c, const jobs::Emit& emit) {
  train::validate_train_config(c, true);
  emit(jobs::stage_event("loading", 0.0, c.model_dir));
  train::TrainBackend backend = train::open_backend(c.model_dir);
  emit(jobs::stage_event("data", 0.0, c.data_dir));
  const bool preference = c.method != train::Method::Sft;
  const train::Dataset data = train::load_dataset(c.data_dir, backend.codec, c.max_seq_length, preference);
  emit(jobs::log_event("train rows " + std::to_string(data.train.size()) + ", valid rows " +
                       std::to_string(data.valid.size()) + ", truncated " +
                       std::to_string(data.train_report.truncated + data.valid_report.truncated) + ", skipped " +
                       std::to_string(data.train_report.skipped_no_targets + data.valid_report.skipped_no_targets)));
  train::LoraParams params = train::init_lora(*backend.sites, c.lora);
  std::unique_ptr<train::LoraGradientEngine> engine =
      train::make_gradient_engine(backend, params, train::training_device(c.device));
  emit(jobs::stage_event("training", 0.0, std::to_string(params.params.size()) + " LoRA pairs"));
  train::TrainHooks hooks;
  hooks.stop_requested = [] { return jobs::stop_requested(); };
  const train::TrainSummary s = train::run_training(c, data, params, *engine, emit, hooks);
  jobs::JobResult r;
  r.output_path = c.adapter_path;
  r.summary = s.to_json();
  return r;
}

jobs::JobKind finetune_kind() {
  jobs::JobKind k;
  k.name = "finetune";
  k.path_fields = {"model_dir", "data_dir", "adapter_path"};
  k.description = "LoRA fine-tuning (sft, dpo, orpo) of an MLX checkpoint -> an mlx-lm adapter folder";
  k.resumable = true;
  k.stoppable = true;
  k.validate = [](const jobs::json& config) {
    const train::TrainConfig c = train::parse_train_config(config);
    train::validate_train_config(c, true);
    if (!train::gradient_engine_available())
      throw Error(ErrorKind::Unsupported, "job kind 'finetune': the LoRA gradient engine is not in this build");
    if (c.device == "cuda" && !train::cuda_training_available())
      throw Error(ErrorKind::Unsupported, "config field 'device': cuda, but this build or machine has no CUDA device");
    const std::string type = load_model_config(c.model_dir).model_type;
    if (!train::lora_training_supported(type))
      throw Error(ErrorKind::Unsupported, "config field 'model_dir': LoRA training does not support model_type '" +
                                              type + "' yet (llama, mistral, qwen2, qwen3, gemma3)");
  };
  k.run = [](const jobs::Emit& emit, const jobs::json& config) {
    return run_finetune(train::parse_train_config(config), emit);
  };
  return k;
}

}  // namespace lathe::lab
