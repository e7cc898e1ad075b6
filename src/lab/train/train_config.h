// The fine-tuning configuration (the `finetune` job's config and `lathe train`'s flags), snake_case as mlx-bun's
// FinetuneSubmit; defaults from its DEFAULT_TRAIN_CONFIG. Parsing validates every field and throws
// InvalidArgument naming the first bad one (a 400 before the job is queued).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lab/train/lora_init.h"

namespace lathe::train {

enum class Method { Sft, Dpo, Orpo };
const char* method_name(Method m);

struct TrainConfig {
  std::string model_dir, data_dir, adapter_path;
  Method method = Method::Sft;
  LoraSpec lora;  // rank 8, scale 1, all seven targets, all layers, seed
  int64_t iters = 100;
  double learning_rate = 2e-4;           // dpo 5e-5, orpo 1e-5 when not given
  std::string lr_schedule = "constant";  // sft: constant; dpo/orpo: cosine
  int64_t warmup = 0;
  int64_t max_seq_length = 512;
  int64_t batch_size = 1;
  int64_t grad_accumulation_steps = 1;
  uint64_t seed = 0;
  int64_t steps_per_report = 10;
  int64_t steps_per_eval = 50;
  int64_t save_every = 0;  // checkpoints every N steps (0: only at the end... none)
  // Stop when the validation loss has not improved (by more than 1e-4) for this many evaluations in a row; the
  // run then ends as a stop request ends it (adapter and checkpoint of the steps taken). 0: never.
  int64_t early_stop_patience = 0;
  // Write the adapter to <adapter_path>/best whenever the validation loss reaches a new best (early stopping's
  // last steps then do not cost the best adapter; HF's load_best_model_at_end).
  bool save_best = false;
  double weight_decay = 0.01;
  double grad_clip_norm = 1.0;
  int64_t val_max_examples = 256;
  double dpo_beta = 0.1;
  double orpo_lambda = 0.1;
  double lora_plus_ratio = 1;      // LoRA+: the B matrices' lr is this times the A matrices' (1: off); > 0
  double lora_dropout = 0;         // LoRA-input dropout in training (lora_dropout.h); [0, 1)
  std::string sft_scope = "full";  // ORPO's NLL term: full | response
  bool pack = false;               // SFT: pack examples into rows of max_seq_length (train_packing.h)
  bool resume = true;              // pick up the last checkpoint in adapter_path/checkpoints
  std::string device = "cpu";      // the gradient engine: cpu | cuda (lora_engine_cuda.h)

  nlohmann::ordered_json to_json() const;
};

// From a job config object; unknown fields, wrong types and out-of-range values throw naming the field.
TrainConfig parse_train_config(const nlohmann::ordered_json& config);
// The cross-field and filesystem checks done before queueing (model_dir has config.json, data_dir has
// train.jsonl, adapter_path is creatable).
void validate_train_config(const TrainConfig& c, bool check_paths);
std::vector<std::string> train_config_fields();

}  // namespace lathe::train
