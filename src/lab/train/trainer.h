// The training loop over a LoraGradientEngine: batches from the BatchPlan, the method's loss (SFT, DPO, ORPO),
// gradient accumulation (each micro-batch's weights scaled 1/k), global-norm clipping (the reported grad_norm is
// pre-clip), AdamW with the LR schedule, validation every steps_per_eval steps, checkpoints every save_every
// steps and resume from the last one, metric events, metrics.jsonl, and the final adapter in adapter_path.
// Deterministic: the same config, data and engine give bit-identical adapters, resumed or not (CPU).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "jobs/job_types.h"
#include "lab/train/lora_gradient.h"
#include "lab/train/train_config.h"
#include "lab/train/train_data.h"

namespace lathe::train {

struct TrainHooks {
  // Stop (as if killed) after this many completed steps, without writing the final adapter; 0: never. Tests.
  int64_t stop_after_step = 0;
  // Polled once a step; true stops with Error(Io) "cancelled" (the job child is SIGTERMed instead, normally).
  std::function<bool()> cancelled;
  // Polled after each step; true ends the run there as if it were the last step: the adapter of the steps taken is
  // written (a job's "stop and save").
  std::function<bool()> stop_requested;
};

struct TrainSummary {
  int64_t steps = 0, resumed_from = 0;
  bool stopped_early = false;  // stop_requested or early_stop_patience ended the run before its iterations
  std::string stop_reason;     // why, when stopped early
  int64_t best_step = -1;      // the step of best_val_loss (with validation data)
  double first_train_loss = 0, last_train_loss = 0;
  double first_val_loss = -1, last_val_loss = -1, best_val_loss = -1;
  double first_margin = 0, last_margin = 0;  // preference methods, on the validation set (else train)
  double wall_seconds = 0, peak_gb = 0;
  std::vector<double> val_trajectory;
  nlohmann::ordered_json to_json() const;
};

// Validation: SFT = mean per-row token-mean NLL over the first val_max_examples rows (one row a forward);
// DPO / ORPO = the loss, accuracy and margin over them.
struct EvalResult {
  double loss = 0, accuracy = 0, margin = 0;
  int64_t rows = 0;
};
EvalResult evaluate(const TrainConfig& config, const std::vector<Example>& rows, LoraGradientEngine& engine);

TrainSummary run_training(const TrainConfig& config, const Dataset& data, LoraParams& params,
                          LoraGradientEngine& engine, const jobs::Emit& emit, const TrainHooks& hooks = {});

// The process's peak resident set (VmHWM), in GiB; 0 when unknown.
double peak_memory_gb();

}  // namespace lathe::train
