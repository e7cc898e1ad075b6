#include "server/engine_service.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <cstdio>

#include "cache/kv_block_pool.h"
#include "common/log.h"
#include "server/api_error.h"
#include "tensor/host_buffer_cache.h"

// bench/host_sampler (preloaded on the device) defines this: profile the engine thread rather than main.
extern "C" void lathe_sample_this_thread() __attribute__((weak));

namespace lathe::server {
namespace {

void release_free_heap() {
  trim_host_buffers(kIdleHostBufferBytes);  // a prefill's working set (up to a sixteenth of RAM) is cached until now
#if defined(__GLIBC__)
  ::malloc_trim(0);  // every arena; pages in use stay, free ones are unmapped or madvise'd away
#endif
}

}  // namespace

GenerationJob::GenerationJob(std::vector<int32_t> prompt, GenerateOptions options, std::string request_id)
    : prompt_(std::move(prompt)),
      options_(std::move(options)),
      request_id_(std::move(request_id)),
      received_(Clock::now()) {}

bool GenerationJob::wait(std::vector<TokenEvent>& out, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return finished_ || !events_.empty(); });
  // A drain counts as a wake: push() need not wake this reader again within kCoalesce, since its own timed poll
  // comes by then. Without this the poll and push()'s wake-ups drift apart and the reader wakes ~1.5 times per
  // interval (on few cores each wake preempts an engine thread).
  if (!events_.empty()) last_wake_ = Clock::now();
  while (!events_.empty()) {
    out.push_back(std::move(events_.front()));
    events_.pop_front();
  }
  return finished_;
}

void GenerationJob::push(TokenEvent e) {
  // Waking the HTTP thread for every token costs a context switch per token, which a fast model on few
  // cores feels. The first token wakes it at once; later ones at most every kCoalesce (the reader also
  // polls that often once tokens flow), so a token is never held back longer than that.
  const auto now = Clock::now();
  bool wake;
  {
    std::lock_guard lock(mu_);
    events_.push_back(std::move(e));
    wake = !started_ || now - last_wake_ >= kCoalesce;
    started_ = true;
    if (wake) last_wake_ = now;
  }
  if (wake) cv_.notify_all();
}

bool GenerationJob::started() const {
  std::lock_guard lock(mu_);
  return started_;
}

void GenerationJob::finish(GenerateResult r, std::exception_ptr error) {
  {
    std::lock_guard lock(mu_);
    result_ = std::move(r);
    error_ = error;
    finished_ = true;
  }
  cv_.notify_all();
}

// Scheduler callbacks for one job (engine thread): tokens and the end go to the job, latencies to the metrics.
class EngineService::JobSink : public SequenceSink {
 public:
  JobSink(EngineService& service, std::shared_ptr<GenerationJob> job) : service_(service), job_(std::move(job)) {}
  void on_token(const GeneratedToken& t) override {
    const auto now = GenerationJob::Clock::now();
    if (t.id >= 0) {
      if (first_)
        service_.metrics_.first_token(std::chrono::duration<double>(now - job_->received_).count());
      else
        service_.metrics_.inter_token(std::chrono::duration<double>(now - last_).count());
      first_ = false;
      last_ = now;
    }
    job_->push(TokenEvent{t.id, t.text, t.sample});
  }
  void on_finish(GenerateResult r) override {
    service_.metrics_.tokens(job_->prompt_.size(), r.tokens.size());
    if (log::level() <= log::Level::Debug) {
      char line[256];
      std::snprintf(line, sizeof line, "request %s: prompt %d tokens (%d cached), %zu generated, ttft %.3f s",
                    job_->request_id_.c_str(), r.prompt_tokens, r.cached_tokens, r.tokens.size(), r.ttft_seconds);
      log::debug(line);
    }
    if (r.finish_reason == "cancelled" && !job_->stopped_by_server()) {
      service_.metrics_.cancelled();
      log::info("request " + job_->request_id_ + ": client went away, generation stopped after " +
                std::to_string(r.tokens.size()) + " tokens");
    }
    job_->finish(std::move(r));
    service_.job_done(job_.get());
  }
  void on_error(std::exception_ptr e) override {
    try {
      std::rethrow_exception(e);
    } catch (const Error& x) {  // the request's own fault (InvalidArgument) is not a server error
      (x.kind() == ErrorKind::InvalidArgument ? log::info : log::error)("request " + job_->request_id_ +
                                                                        ": generation failed: " + x.what());
    } catch (const std::exception& x) {
      log::error("request " + job_->request_id_ + ": generation failed: " + x.what());
    }
    job_->finish(GenerateResult{}, e);
    service_.job_done(job_.get());
  }

 private:
  EngineService& service_;
  std::shared_ptr<GenerationJob> job_;
  bool first_ = true;
  GenerationJob::Clock::time_point last_;
};

EngineService::EngineService(ModelBundle& bundle, Metrics& metrics, size_t max_queue, SchedulerOptions scheduler,
                             SsdStore* ssd, SsdTierOptions tier)
    : metrics_(metrics), max_queue_(max_queue), scheduler_(bundle, scheduler) {
  if (ssd) scheduler_.enable_ssd(*ssd, tier);
  const SchedulerOptions& o = scheduler_.options();
  // CPU KV blocks long enough that the budget, filled, stays well inside the process's mapping limit.
  set_kv_pool_budget(o.kv_cache_bytes);
  const int64_t per_token = std::max<int64_t>(1, scheduler_.budget().bytes_per_token());
  log::info("scheduler: up to " + std::to_string(o.max_batch) + " sequences and " + std::to_string(o.max_batch_tokens) +
            " tokens a step, prefill chunk " + std::to_string(o.prefill_chunk) + ", KV budget " +
            std::to_string(o.kv_cache_bytes >> 20) + " MiB (~" + std::to_string(o.kv_cache_bytes / per_token) +
            " tokens)");
  metrics_.set_kv_budget(scheduler_.stats().kv_bytes_budget);
  thread_ = std::thread([this] { loop(); });
}

EngineService::~EngineService() {
  cancel_all();
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void EngineService::cancel_all() {
  {
    std::lock_guard lock(mu_);
    refusing_ = true;
    for (auto& job : queue_) job->cancel_for_shutdown();
    for (GenerationJob* job : live_) job->cancel_for_shutdown();
  }
  cv_.notify_all();
}

void EngineService::job_done(GenerationJob* job) {
  {
    std::lock_guard lock(mu_);
    live_.erase(std::remove(live_.begin(), live_.end(), job), live_.end());
  }
  metrics_.add_in_flight(-1);
}
std::shared_ptr<GenerationJob> EngineService::submit(std::vector<int32_t> prompt, GenerateOptions options,
                                                     std::string request_id) {
  // Refused here, before any response is sent, rather than by the scheduler after the stream has started.
  // (The budget and the options are fixed once the service is built, so reading them here is safe.)
  const int64_t need = scheduler_.budget().bytes_for(static_cast<int64_t>(prompt.size()));
  if (need > scheduler_.options().kv_cache_bytes)
    throw ApiError(400,
                   "the prompt (" + std::to_string(prompt.size()) + " tokens) needs " + std::to_string(need) +
                       " bytes of KV cache; the server's whole budget (--kv-cache-bytes) is " +
                       std::to_string(scheduler_.options().kv_cache_bytes),
                   "prompt", "context_length_exceeded");
  auto job = std::make_shared<GenerationJob>(std::move(prompt), std::move(options), std::move(request_id));
  std::vector<std::shared_ptr<GenerationJob>> dropped;
  size_t waiting = 0;
  bool full = false;
  {
    std::lock_guard lock(mu_);
    // Requests whose clients left while queued no longer hold a place: without this, a queue full of them kept
    // answering 429 until the running generation ended and the engine thread popped them one by one.
    for (auto it = queue_.begin(); it != queue_.end();) {
      if ((*it)->cancelled()) {
        dropped.push_back(std::move(*it));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    if (refusing_) throw ApiError(503, "the server is shutting down", std::string(), "shutting_down");
    waiting = queue_.size();
    full = waiting >= max_queue_;
    if (!full) queue_.push_back(job);
    metrics_.set_queue_depth(static_cast<int64_t>(queue_.size()));
  }
  for (auto& d : dropped) finish_cancelled(*d);
  if (!dropped.empty()) metrics_.add_in_flight(-static_cast<int64_t>(dropped.size()));
  if (full)
    throw ApiError(429, "the server is busy: " + std::to_string(waiting) + " requests are queued", std::string(),
                   "queue_full");
  metrics_.add_in_flight(1);
  cv_.notify_one();
  return job;
}

size_t EngineService::queued() const {
  std::lock_guard lock(mu_);
  return queue_.size();
}

void EngineService::finish_cancelled(GenerationJob& job) {
  GenerateResult r;
  r.finish_reason = "cancelled";
  metrics_.cancelled();
  job.finish(std::move(r));
}

void EngineService::loop() {
  if (lathe_sample_this_thread) lathe_sample_this_thread();
  const size_t max_rows = static_cast<size_t>(scheduler_.options().max_batch);
  int trims_due = 0;  // heap trims left for the coming idle spell (none before the first request)
  for (;;) {
    std::vector<std::shared_ptr<GenerationJob>> take;
    {
      std::unique_lock lock(mu_);
      auto ready = [&] { return stopping_ || !queue_.empty() || !scheduler_.idle(); };
      // Idle: wake when the SSD tier's write-behind or demotion is due. Going idle after work, the heap's free
      // pages go back to the OS: glibc keeps what a burst of requests freed (per-thread arenas, the middle of the
      // heap) mapped, so without this the resident size after a load stays tens of MB above the warm baseline
      // although nothing is in use (issue #12's load check). Once at once, once 2 s later for what the clients'
      // connections freed as they closed.
      for (double due = scheduler_.housekeeping(); !ready(); due = scheduler_.housekeeping()) {
        publish_cache_stats();
        if (trims_due > 0) {
          lock.unlock();
          release_free_heap();
          lock.lock();
          --trims_due;
          if (ready()) break;
        }
        if (trims_due > 0) due = due < 0 ? 2.0 : std::min(due, 2.0);
        if (due < 0)
          cv_.wait(lock, ready);
        else
          cv_.wait_for(lock, std::chrono::duration<double>(due + 0.001), ready);
      }
      if (stopping_ && queue_.empty() && scheduler_.idle()) {
        lock.unlock();
        scheduler_.flush_ssd();  // a graceful stop keeps what RAM held for the next start
        publish_cache_stats();
        return;
      }
      // Requests join between steps while the batch has rows free; the rest keep their queue places.
      while (!queue_.empty() && scheduler_.rows() + take.size() < max_rows) {
        take.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      for (auto& job : take) live_.push_back(job.get());
      metrics_.set_queue_depth(static_cast<int64_t>(queue_.size()));
    }
    trims_due = 2;
    for (auto& job : take) {  // one cancelled meanwhile leaves at the step below, without running
      GenerateOptions opt = job->options_;
      opt.cancel = &job->cancel_;
      scheduler_.add(job->prompt_, std::move(opt), std::make_shared<JobSink>(*this, job));
    }
    scheduler_.step();
    const SchedulerStats& st = scheduler_.stats();
    metrics_.set_batch(st.running, st.waiting, st.batch_rows, st.batch_tokens, st.kv_bytes_used);
    metrics_.set_preemptions(st.preemptions);
    metrics_.set_prefix_waits(st.prefix_waits);
    metrics_.set_overlapped_steps(st.overlapped_steps);
    metrics_.set_step_times(st.steps, st.step_seconds, st.forward_seconds, st.sample_seconds, st.emit_seconds);
    scheduler_.housekeeping();
    publish_cache_stats();
  }
}

void EngineService::publish_cache_stats() { metrics_.set_cache_tiers(scheduler_.cache_stats()); }

}  // namespace lathe::server
