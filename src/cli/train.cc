// lathe train --model DIR --data DIR --adapter-path OUT [--method sft|dpo|orpo] [...]: the finetune job in the
// foreground (a progress line on a terminal, plain lines otherwise); the summary is printed as JSON on stdout.
// The flags are the finetune job's config fields (train_config.h), validated the same way.
#include <unistd.h>

#include <cstdio>

#include "cli/verbs.h"
#include "jobs/job_format.h"
#include "jobs/stop_request.h"
#include "lab/train/finetune_job.h"
#include "lab/train/train_config.h"

namespace lathe::cli {

namespace {

struct TrainFlags {
  std::string model, data, adapter_path, method = "sft", lr_schedule, sft_scope = "full", device = "cpu";
  int64_t iters = 100, rank = 8, batch_size = 1, grad_accum = 1, seed = 0, steps_per_eval = 50, steps_per_report = 10,
          save_every = 0, early_stop_patience = 0, max_seq_length = 512, num_layers = -1, warmup = 0,
          val_max_examples = 256;
  double learning_rate = -1, scale = 1.0, lora_dropout = 0, lora_plus_ratio = 1.0, weight_decay = 0.01, grad_clip = 1.0,
         dpo_beta = 0.1, orpo_lambda = 0.1;
  bool rs_lora = false, no_resume = false, pack = false, save_best = false;
  std::vector<std::string> target_modules;
};

jobs::json to_config(const TrainFlags& f) {
  jobs::json c = {{"model_dir", f.model},
                  {"data_dir", f.data},
                  {"adapter_path", f.adapter_path},
                  {"method", f.method},
                  {"iters", f.iters},
                  {"rank", f.rank},
                  {"scale", f.scale},
                  {"rs_lora", f.rs_lora},
                  {"lora_dropout", f.lora_dropout},
                  {"lora_plus_ratio", f.lora_plus_ratio},
                  {"num_layers", f.num_layers},
                  {"batch_size", f.batch_size},
                  {"grad_accumulation_steps", f.grad_accum},
                  {"seed", f.seed},
                  {"steps_per_eval", f.steps_per_eval},
                  {"steps_per_report", f.steps_per_report},
                  {"save_every", f.save_every},
                  {"early_stop_patience", f.early_stop_patience},
                  {"save_best", f.save_best},
                  {"max_seq_length", f.max_seq_length},
                  {"warmup", f.warmup},
                  {"weight_decay", f.weight_decay},
                  {"grad_clip_norm", f.grad_clip},
                  {"val_max_examples", f.val_max_examples},
                  {"dpo_beta", f.dpo_beta},
                  {"orpo_lambda", f.orpo_lambda},
                  {"sft_scope", f.sft_scope},
                  {"pack", f.pack},
                  {"device", f.device},
                  {"resume", !f.no_resume}};
  if (f.learning_rate >= 0) c["learning_rate"] = f.learning_rate;
  if (!f.lr_schedule.empty()) c["lr_schedule"] = f.lr_schedule;
  if (!f.target_modules.empty()) c["target_modules"] = f.target_modules;
  return c;
}

}  // namespace

Verb add_train(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  CLI::App* cmd = app.add_subcommand("train", "LoRA fine-tuning (sft, dpo, orpo) into an mlx-lm adapter folder");
  cmd->fallthrough();
  cmd->add_option("--model", f->model, "base checkpoint directory");
  cmd->add_option("--data", f->data, "directory with train.jsonl (and valid.jsonl)");
  cmd->add_option("--adapter-path", f->adapter_path, "output adapter directory (resumes from its checkpoints)");
  cmd->add_option("--method", f->method, "sft, dpo or orpo")->capture_default_str();
  cmd->add_option("--iters", f->iters, "optimizer steps")->capture_default_str();
  cmd->add_option("--learning-rate", f->learning_rate, "peak LR (default: sft 2e-4, dpo 5e-5, orpo 1e-5)");
  cmd->add_option("--lr-schedule", f->lr_schedule, "constant or cosine (default: sft constant, else cosine)");
  cmd->add_option("--warmup", f->warmup, "linear warmup steps")->capture_default_str();
  cmd->add_option("--rank", f->rank, "LoRA rank")->capture_default_str();
  cmd->add_option("--scale", f->scale, "LoRA scale (mlx-lm lora_parameters.scale)")->capture_default_str();
  cmd->add_flag("--rs-lora", f->rs_lora, "rsLoRA: scale / sqrt(rank)");
  cmd->add_option("--lora-dropout", f->lora_dropout, "dropout on the LoRA input in training, [0, 1)")
      ->capture_default_str();
  cmd->add_option("--lora-plus-ratio", f->lora_plus_ratio, "LoRA+: B matrices learn at R x the lr of A (1: off)")
      ->capture_default_str();
  cmd->add_option("--target-modules", f->target_modules, "module suffixes (default: the 7 attention/MLP linears)");
  cmd->add_option("--num-layers", f->num_layers, "train the last N blocks (-1: all)")->capture_default_str();
  cmd->add_option("--batch-size", f->batch_size, "sequences per micro-batch")->capture_default_str();
  cmd->add_option("--grad-accum", f->grad_accum, "micro-batches per step")->capture_default_str();
  cmd->add_option("--seed", f->seed, "init and data-order seed")->capture_default_str();
  cmd->add_option("--steps-per-eval", f->steps_per_eval, "validate every N steps")->capture_default_str();
  cmd->add_option("--steps-per-report", f->steps_per_report, "train metrics every N steps")->capture_default_str();
  cmd->add_option("--save-every", f->save_every, "checkpoint every N steps (0: off)")->capture_default_str();
  cmd->add_option("--early-stop-patience", f->early_stop_patience,
                  "stop when the validation loss has not improved for N evaluations (0: off)")
      ->capture_default_str();
  cmd->add_flag("--save-best", f->save_best,
                "also write the adapter to ADAPTER_PATH/best at each new best validation loss");
  cmd->add_option("--max-seq-length", f->max_seq_length, "truncate rows to this many tokens")->capture_default_str();
  cmd->add_option("--weight-decay", f->weight_decay, "AdamW decoupled weight decay")->capture_default_str();
  cmd->add_option("--grad-clip", f->grad_clip, "global-norm clip (0: off)")->capture_default_str();
  cmd->add_option("--val-max-examples", f->val_max_examples, "validation rows used")->capture_default_str();
  cmd->add_option("--dpo-beta", f->dpo_beta, "DPO beta")->capture_default_str();
  cmd->add_option("--orpo-lambda", f->orpo_lambda, "ORPO lambda")->capture_default_str();
  cmd->add_option("--sft-scope", f->sft_scope, "ORPO NLL term: full or response")->capture_default_str();
  cmd->add_flag("--pack", f->pack, "sft: pack several examples into each row of max-seq-length tokens");
  cmd->add_option("--device", f->device, "cpu or cuda: where the gradients are computed (f32)")->capture_default_str();
  cmd->add_flag("--no-resume", f->no_resume, "start over even if adapter-path has checkpoints");
  const Verb grads = add_train_grads(*cmd);
  return {cmd, [f, cmd, grads] {
            if (grads.command->parsed()) return grads.action();
            // `train grads` (the gradient check) is another verb's sub-command; here the three paths are needed.
            if (f->model.empty() || f->data.empty() || f->adapter_path.empty()) {
              std::fprintf(stderr, "%s\nlathe train: --model, --data and --adapter-path are required\n",
                           cmd->help().c_str());
              return 2;
            }
            const train::TrainConfig config = train::parse_train_config(to_config(*f));
            const jobs::Emit emit = jobs::terminal_emit(::isatty(2) != 0);
            jobs::handle_stop_requests();  // `kill -USR1` stops after the current step and writes the adapter
            const jobs::JobResult r = lab::run_finetune(config, emit);
            std::printf("%s\n", r.summary.dump(2).c_str());
            return 0;
          }};
}

}  // namespace lathe::cli
