#include "lab/train/trainer.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "common/log.h"
#include "common/os_error.h"
#include "io/mapped_file.h"
#include "lab/train/adapter_writer.h"
#include "lab/train/lr_schedule.h"
#include "lab/train/optimizer.h"
#include "lab/train/train_checkpoint.h"
#include "lab/train/train_losses.h"
#include "lab/train/train_packing.h"
#include "tensor/device_memory.h"

namespace lathe::train {
namespace {

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The sequences one forward sees for a set of examples, laid out as train_losses.h says.
std::vector<TrainSequence> forward_batch(const TrainConfig& c, const std::vector<Example>& rows,
                                         const std::vector<size_t>& pick) {
  std::vector<TrainSequence> out;
  if (c.method == Method::Sft) {
    for (size_t i : pick) out.push_back(rows[i].seq);
    return out;
  }
  for (size_t i : pick) out.push_back(rows[i].seq);
  for (size_t i : pick) out.push_back(rows[i].rejected);
  if (c.method == Method::Orpo && c.sft_scope == "full")
    for (size_t i : pick) {
      TrainSequence s = rows[i].seq;
      for (size_t j = 1; j < s.target.size(); ++j) s.target[j] = 1;
      out.push_back(std::move(s));
    }
  return out;
}

LossResult method_loss(const TrainConfig& c, LoraGradientEngine& engine, const std::vector<TrainSequence>& batch) {
  if (c.method == Method::Sft) return sft_loss(engine.forward(batch, true));
  if (c.method == Method::Dpo) {
    const SequenceLogProbs ref = engine.forward(batch, false);
    return dpo_loss(engine.forward(batch, true), ref, c.dpo_beta);
  }
  return orpo_loss(engine.forward(batch, true), c.orpo_lambda, c.sft_scope == "full");
}

// Appends one JSON line to metrics.jsonl (a log, not a document: appended and flushed line by line).
class MetricsFile {
 public:
  explicit MetricsFile(const std::string& path) : path_(path) {
    errno = 0;
    out_.open(path, std::ios::app | std::ios::binary);
    if (!out_) {
      const int err = errno;  // what the open(2) under the stream said, if it got that far
      const std::string what = "cannot open " + path + " for appending";
      if (err != 0) throw OsError(err, what);
      throw Error(ErrorKind::Io, what);
    }
  }
  // A line the disk cannot take fails the run (a full disk is a storage error, not metrics silently lost).
  void write(const ojson& j) {
    const std::string line = j.dump() + '\n';
    errno = 0;
    out_.write(line.data(), static_cast<std::streamsize>(line.size()));
    if (out_) out_.flush();
    if (!out_) {
      const int err = errno;  // what the write(2) under the stream said, if it got that far
      if (err != 0) throw OsError(path_ + ": cannot append a line", err);
      throw Error(ErrorKind::Io, path_ + ": cannot append a line");
    }
  }

 private:
  std::string path_;
  std::ofstream out_;
};

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

double peak_memory_gb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::atof(line.c_str() + 6) / (1024.0 * 1024.0);  // kB
  return 0;
}

ojson TrainSummary::to_json() const {
  ojson j;
  j["steps"] = steps;
  j["resumed_from"] = resumed_from;
  if (stopped_early) j["stopped_early"] = true, j["stop_reason"] = stop_reason;
  j["first_train_loss"] = first_train_loss;
  j["last_train_loss"] = last_train_loss;
  if (first_val_loss >= 0) {
    j["first_val_loss"] = first_val_loss;
    j["last_val_loss"] = last_val_loss;
    j["best_val_loss"] = best_val_loss;
    j["best_step"] = best_step;
    j["val_trajectory"] = val_trajectory;
  }
  j["first_margin"] = first_margin;
  j["last_margin"] = last_margin;
  j["wall_seconds"] = wall_seconds;
  j["peak_gb"] = peak_gb;
  return j;
}

EvalResult evaluate(const TrainConfig& c, const std::vector<Example>& rows, LoraGradientEngine& engine) {
  EvalResult r;
  const size_t n = std::min(rows.size(), static_cast<size_t>(c.val_max_examples));
  for (size_t i = 0; i < n; ++i) {
    const LossResult l = method_loss(c, engine, forward_batch(c, rows, {i}));
    r.loss += l.loss, r.accuracy += l.accuracy, r.margin += l.margin;
    ++r.rows;
  }
  if (r.rows > 0) {
    const double d = static_cast<double>(r.rows);
    r.loss /= d, r.accuracy /= d, r.margin /= d;
  }
  return r;
}

TrainSummary run_training(const TrainConfig& c, const Dataset& data, LoraParams& params, LoraGradientEngine& engine,
                          const jobs::Emit& emit, const TrainHooks& hooks) {
  namespace fs = std::filesystem;
  const auto t_start = Clock::now();
  std::error_code ec;
  fs::create_directories(c.adapter_path, ec);
  if (ec) throw OsError("cannot create " + c.adapter_path, ec.value());
  AdamWOptions ao;
  ao.weight_decay = c.weight_decay;
  ao.lora_plus_ratio = c.lora_plus_ratio;
  AdamW opt(params, ao);
  // Packed: batch_size rows of up to max_seq_length tokens, each holding several examples. Validation stays
  // per example (its loss is a mean over examples).
  const std::vector<Example> packed = c.pack ? pack_examples(data.train, c.max_seq_length) : std::vector<Example>{};
  const std::vector<Example>& train_rows = c.pack ? packed : data.train;
  const BatchPlan plan(train_rows, c.batch_size, c.seed);
  LrSchedule sched;
  sched.kind = c.lr_schedule;
  sched.peak = c.learning_rate;
  sched.warmup = c.warmup;
  sched.iters = c.iters;

  TrainState state;
  state.seed = c.seed;
  state.lora_dropout = c.lora_dropout;
  TrainSummary sum;
  if (c.resume)
    if (const auto ck = latest_checkpoint(c.adapter_path)) {
      state = load_checkpoint(*ck, params, opt);
      if (state.seed != c.seed)
        throw Error(ErrorKind::InvalidArgument, "the checkpoint " + *ck + " was trained with seed " +
                                                    std::to_string(state.seed) + ", this run has " +
                                                    std::to_string(c.seed) + " (resume: false starts over)");
      if (state.lora_dropout != c.lora_dropout)
        throw Error(ErrorKind::InvalidArgument, "the checkpoint " + *ck + " was trained with lora_dropout " +
                                                    std::to_string(state.lora_dropout) + ", this run has " +
                                                    std::to_string(c.lora_dropout) + " (resume: false starts over)");
      sum.resumed_from = state.step;
      emit(jobs::log_event("resuming from " + *ck + " (step " + std::to_string(state.step) + ")"));
    }

  MetricsFile metrics(c.adapter_path + "/metrics.jsonl");
  {
    ojson meta = {{"type", "meta"},
                  {"t", now_seconds()},
                  {"method", method_name(c.method)},
                  {"model", c.model_dir},
                  {"iters", c.iters},
                  {"learning_rate", c.learning_rate},
                  {"max_seq_length", c.max_seq_length},
                  {"batch_size", c.batch_size},
                  {"rank", c.lora.rank},
                  {"scale", c.lora.scale},
                  {"lora_dropout", c.lora_dropout},
                  {"lora_plus_ratio", c.lora_plus_ratio},
                  {"pack", c.pack},
                  {"adapter_path", c.adapter_path}};
    if (c.method == Method::Orpo) meta["orpo_lambda"] = c.orpo_lambda, meta["sft_scope"] = c.sft_scope;
    if (sum.resumed_from > 0) meta["resumed_from"] = sum.resumed_from;
    if (c.pack) {
      const PaddingStats before = padding_stats(data.train, c.batch_size, c.seed);
      const PaddingStats after = padding_stats(train_rows, c.batch_size, c.seed);
      meta["packing"] = {{"examples", data.train.size()},
                         {"rows", after.rows},
                         {"pad_tokens", after.pad_tokens},
                         {"unpacked_pad_tokens", before.pad_tokens}};
    }
    metrics.write(meta);
  }
  const auto report = [&](ojson e) {
    e["t"] = now_seconds();
    metrics.write(e);
    emit(e);
  };
  int64_t evals_since_best = 0, best_step = 0;
  const auto run_eval = [&](int64_t step) {
    if (data.valid.empty()) return;
    const EvalResult r = evaluate(c, data.valid, engine);
    if (sum.first_val_loss < 0) sum.first_val_loss = r.loss, sum.first_margin = r.margin;
    sum.last_val_loss = r.loss, sum.last_margin = r.margin;
    // Early stopping counts the evaluations since the best loss (an improvement must beat it by 1e-4).
    if (sum.best_val_loss < 0 || r.loss < sum.best_val_loss - 1e-4) {
      evals_since_best = 0, best_step = step;
      if (c.save_best) {
        write_adapter(c.adapter_path + "/best", c, params);
        emit(jobs::stage_event("best", static_cast<double>(step) / static_cast<double>(c.iters),
                               c.adapter_path + "/best (validation loss " + std::to_string(r.loss) + ", step " +
                                   std::to_string(step) + ")"));
      }
    } else {
      ++evals_since_best;
    }
    sum.best_step = best_step;
    sum.best_val_loss = sum.best_val_loss < 0 ? r.loss : std::min(sum.best_val_loss, r.loss);
    sum.val_trajectory.push_back(r.loss);
    ojson e = {{"type", "metric"}, {"kind", "val"}, {"step", step}, {"loss", r.loss}, {"rows", r.rows}};
    if (c.method != Method::Sft) e["accuracy"] = r.accuracy, e["margin"] = r.margin;
    report(e);
  };

  if (state.step == 0) run_eval(0);
  auto window_start = Clock::now();
  double window_eval_s = 0, window_loss = 0;
  int64_t window_tokens = 0, window_steps = 0;
  const auto run_start = Clock::now();
  const int64_t first_step = state.step;
  bool first = true;
  for (int64_t step = state.step + 1; step <= c.iters; ++step) {
    if (hooks.cancelled && hooks.cancelled())
      throw Error(ErrorKind::Io, "training cancelled at step " + std::to_string(step));
    clear_grads(params);
    double loss = 0, acc = 0, margin = 0;
    const double k = static_cast<double>(c.grad_accumulation_steps);
    for (int64_t m = 0; m < c.grad_accumulation_steps; ++m) {
      const auto batch = forward_batch(c, train_rows, plan.batch(state.batches_seen++));
      // Keyed by (seed, step, micro-batch): a resumed run redraws the very masks the uninterrupted one drew.
      engine.dropout_next({c.lora_dropout, c.seed, step, m});
      LossResult l = method_loss(c, engine, batch);
      for (double& w : l.weight) w /= k;
      engine.backward(l.weight);
      loss += l.loss / k, acc += l.accuracy / k, margin += l.margin / k;
      window_tokens += c.method == Method::Sft ? l.n_targets : 0;
    }
    if (!std::isfinite(loss))
      throw Error(ErrorKind::Internal,
                  "the training loss is not finite at step " + std::to_string(step) + " (try a lower learning_rate)");
    const double norm = clip_grad_norm(params, c.grad_clip_norm);
    const double lr = sched.at(step);
    opt.step(params, lr);
    state.step = step;
    if (first) sum.first_train_loss = loss, first = false;
    sum.last_train_loss = loss;
    if (data.valid.empty()) sum.last_margin = margin;
    window_loss += loss, ++window_steps;

    if (step % c.steps_per_report == 0 || step == 1 || step == c.iters) {
      const double wall = seconds_since(window_start) - window_eval_s;
      const double per_step = seconds_since(run_start) / static_cast<double>(step - first_step);
      const double eta = per_step * static_cast<double>(c.iters - step);
      char msg[160];
      std::snprintf(msg, sizeof msg, "step %lld/%lld loss %.4f lr %.3g", static_cast<long long>(step),
                    static_cast<long long>(c.iters), window_loss / static_cast<double>(window_steps), lr);
      ojson e = {{"type", "metric"},
                 {"kind", "train"},
                 {"step", step},
                 {"loss", window_loss / static_cast<double>(window_steps)},
                 {"grad_norm", norm},
                 {"learning_rate", lr},
                 {"progress", static_cast<double>(step) / static_cast<double>(c.iters)},
                 {"tokens_per_sec", wall > 0 ? static_cast<double>(window_tokens) / wall : 0.0},
                 {"peak_gb", peak_memory_gb()},
                 {"eta_s", eta},
                 {"message", msg}};
      if (c.method != Method::Sft) e["accuracy"] = acc, e["margin"] = margin;
      if (c.device == "cuda")  // the GPU's share: the caching allocator's peak reserve
        e["peak_device_gb"] = static_cast<double>(device_memory_stats().peak_reserved_bytes) / (1 << 30);
      report(e);
      window_start = Clock::now();
      window_eval_s = 0, window_loss = 0, window_tokens = 0, window_steps = 0;
    }
    if (step % c.steps_per_eval == 0 || step == c.iters) {
      const auto t = Clock::now();
      run_eval(step);
      window_eval_s += seconds_since(t);
    }
    if (c.save_every > 0 && step % c.save_every == 0 && step < c.iters) {
      const std::string dir = save_checkpoint(c.adapter_path, c, params, opt, state);
      emit(jobs::stage_event("checkpoint", static_cast<double>(step) / static_cast<double>(c.iters), dir));
    }
    if (hooks.stop_after_step > 0 && step >= hooks.stop_after_step) {
      sum.steps = step;
      return sum;
    }
    const bool asked = hooks.stop_requested && hooks.stop_requested();
    const bool stalled = c.early_stop_patience > 0 && evals_since_best >= c.early_stop_patience;
    if (step < c.iters && (asked || stalled)) {
      sum.stopped_early = true;
      char why[160];
      if (asked)
        std::snprintf(why, sizeof why, "stop requested");
      else
        std::snprintf(why, sizeof why, "validation loss not improved for %lld evaluations (best %.4f at step %lld)",
                      static_cast<long long>(evals_since_best), sum.best_val_loss, static_cast<long long>(best_step));
      sum.stop_reason = why;
      emit(jobs::log_event("stopped early at step " + std::to_string(step) + " of " + std::to_string(c.iters) + " (" +
                           sum.stop_reason + "): writing the adapter of the steps taken"));
      // A checkpoint too (unless this step just wrote one), so the same config run again resumes from here.
      if (!(c.save_every > 0 && step % c.save_every == 0)) {
        const std::string dir = save_checkpoint(c.adapter_path, c, params, opt, state);
        emit(jobs::stage_event("checkpoint", static_cast<double>(step) / static_cast<double>(c.iters), dir));
      }
      break;
    }
  }
  write_adapter(c.adapter_path, c, params);
  sum.steps = state.step;
  sum.wall_seconds = seconds_since(t_start);
  sum.peak_gb = peak_memory_gb();
  const std::string s = sum.to_json().dump(2) + "\n";
  // metrics.json: the run's summary next to the adapter (the reference writes it with checkpoints on).
  write_file_atomic(c.adapter_path + "/metrics.json", s.data(), s.size());
  return sum;
}

}  // namespace lathe::train
