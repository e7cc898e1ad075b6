// Iteration-level scheduling of many sequences over one model. Each step() admits waiting requests (FIFO, up
// to max_batch rows, while the KV budget has room for their prompts), gives every running row its next tokens —
// one for a decoding row, a prefill chunk of at most prefill_chunk for a row still reading its prompt, within
// max_batch_tokens — runs them as one Model::forward(const Batch&), samples the rows that reached the end of
// their input and hands each its token. Prefill chunks sit beside decode tokens, so a long prompt never stalls
// running streams.
//
// When growing rows outrun the KV budget, finished caches kept for prefix reuse go first, then the newest
// running row is preempted: its cache is dropped and it waits again, to be recomputed from prompt + generated
// tokens; its sampler, stops and detokenizer are kept, so its output is unchanged. A row whose client left
// (options.cancel) leaves at the next step. A request's tokens never depend on the load: chunk boundaries are
// fixed per row and every row samples from its own (seed, step) stream.
//
// Single-threaded: the caller (the server's engine thread, or a test) owns the scheduler and the model.
#pragma once
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "engine/kv_budget.h"
#include "engine/model_bundle.h"
#include "engine/sequence_state.h"

namespace lathe {

struct SchedulerOptions {
  int max_batch = 8;           // rows in one step
  int max_batch_tokens = 512;  // tokens in one step (a decoding row counts one)
  int prefill_chunk = 256;     // prompt tokens one row feeds per step (clamped to fit beside max_batch decodes)
  int64_t kv_cache_bytes = 0;  // KV budget; 0 = half of the available memory
  int reuse_slots = 4;         // finished sequences whose caches stay for prefix reuse
  // Throws InvalidArgument naming the flag for values that cannot work.
  void validate() const;
};

// Where a sequence's output goes; called on the scheduler's thread.
class SequenceSink {
 public:
  virtual ~SequenceSink() = default;
  virtual void on_token(const GeneratedToken& t) = 0;
  // Last call for a sequence that ran (finish_reason stop, length or cancelled; cached_tokens set).
  virtual void on_finish(GenerateResult r) = 0;
  // Last call for a sequence that cannot run (a prompt larger than the whole budget, a failed forward).
  virtual void on_error(std::exception_ptr e) = 0;
};

struct SchedulerStats {
  int64_t running = 0, waiting = 0;          // rows now
  int64_t batch_rows = 0, batch_tokens = 0;  // of the last step
  int64_t kv_bytes_used = 0, kv_bytes_budget = 0;
  int64_t preemptions = 0, steps = 0;  // since start
};

class Scheduler {
 public:
  Scheduler(ModelBundle& bundle, SchedulerOptions options);
  ~Scheduler();

  // Queues a request (FIFO). Errors (empty prompt, bad max_tokens, a prompt that can never fit) go to the sink.
  void add(std::vector<int32_t> prompt, GenerateOptions options, std::shared_ptr<SequenceSink> sink);
  // One iteration; does nothing when idle().
  void step();
  bool idle() const { return running_.empty() && waiting_.empty(); }
  // Rows waiting + running: how many more add() calls the next step could admit is max_batch minus this.
  size_t rows() const { return running_.size() + waiting_.size(); }
  const SchedulerStats& stats() const { return stats_; }
  const SchedulerOptions& options() const { return options_; }
  const KvBudget& budget() const { return budget_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Row;
  struct Idle {
    CacheList cache;
    std::vector<int32_t> tokens;  // what the cache holds
    std::string adapter_key;      // the adapter set it was computed under ("" = base): reused only under it
  };

  void drop_cancelled();
  void admit();
  void attach_cache(Row& row);
  int64_t claim(const Row& row, int64_t extra) const;  // bytes the row holds after `extra` more tokens
  int64_t idle_bytes() const;
  bool evict_idle();
  void preempt(size_t index);
  void finish(std::unique_ptr<Row> row, const std::string& reason);
  void keep_for_reuse(Row& row);
  void sample_rows(const Tensor& logits, const std::vector<Row*>& rows);
  // One forward per pinned adapter table among the batch's rows (usually one), logits in row order.
  Tensor forward_grouped(const Batch& batch, const std::vector<Row*>& in_batch);

  ModelBundle& bundle_;
  SchedulerOptions options_;
  KvBudget budget_;
  int64_t chunk_;
  uint64_t next_order_ = 0;
  std::deque<std::unique_ptr<Row>> waiting_;   // by arrival
  std::vector<std::unique_ptr<Row>> running_;  // by admission
  std::list<Idle> idle_;                       // most recently finished first
  SchedulerStats stats_;
};

}  // namespace lathe
