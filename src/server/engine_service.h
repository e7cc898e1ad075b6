// One engine thread owns the model and runs the scheduler (engine/scheduler.h): generation requests queue FIFO
// (bounded: a full queue is a 429), join the running batch between steps as rows free up, and each streams its
// tokens back through its own GenerationJob, which the HTTP thread drains. Cancelling a job (client gone) stops
// it at the next step, or skips it if it is still queued.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/model_bundle.h"
#include "engine/scheduler.h"
#include "server/metrics.h"

namespace lathe::server {

struct TokenEvent {
  int32_t id = -1;  // -1: text flushed at the end, not tied to a token
  std::string text;
  SampleResult sample;
};

class GenerationJob {
 public:
  using Clock = std::chrono::steady_clock;
  GenerationJob(std::vector<int32_t> prompt, GenerateOptions options, std::string request_id);

  // HTTP side: waits up to `timeout` for events and appends them to `out`. True once the job has finished and
  // every event has been handed out.
  bool wait(std::vector<TokenEvent>& out, std::chrono::milliseconds timeout);
  void cancel() { cancel_.store(true); }
  // Cancelled because the server is shutting down (the client is still there and gets a proper end: an error
  // event that says why on a stream, 503 shutting_down on a blocking request).
  void cancel_for_shutdown() {
    shutdown_.store(true);
    cancel_.store(true);
  }
  bool shut_down() const { return shutdown_.load(); }
  bool stopped_by_server() const { return shut_down(); }
  // Tokens are flowing: the reader should poll every kCoalesce rather than rely on wake-ups alone.
  bool started() const;
  static constexpr std::chrono::milliseconds kCoalesce{3};
  bool cancelled() const { return cancel_.load(); }
  // Valid once wait() returned true.
  const GenerateResult& result() const { return result_; }
  std::exception_ptr error() const { return error_; }  // set when the engine failed
  const std::string& request_id() const { return request_id_; }
  Clock::time_point received() const { return received_; }

 private:
  friend class EngineService;
  void push(TokenEvent e);
  void finish(GenerateResult r, std::exception_ptr error = nullptr);

  std::vector<int32_t> prompt_;
  GenerateOptions options_;
  std::string request_id_;
  Clock::time_point received_;
  std::atomic<bool> cancel_{false};
  std::atomic<bool> shutdown_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;
  bool started_ = false;  // a token has been pushed
  Clock::time_point last_wake_;
  bool finished_ = false;
  GenerateResult result_;
  std::exception_ptr error_;
};

class EngineService {
 public:
  // ssd (optional, scanned, outliving this): the prompt cache's SSD tier.
  EngineService(ModelBundle& bundle, Metrics& metrics, size_t max_queue, SchedulerOptions scheduler = {},
                SsdStore* ssd = nullptr, SsdTierOptions tier = {});
  ~EngineService();
  EngineService(const EngineService&) = delete;
  EngineService& operator=(const EngineService&) = delete;

  // Queues a generation. Throws ApiError(429) when max_queue requests are already waiting.
  std::shared_ptr<GenerationJob> submit(std::vector<int32_t> prompt, GenerateOptions options, std::string request_id);
  size_t queued() const;
  // Shutdown: every queued and running generation stops at the engine's next step (cancel_for_shutdown) and
  // later submits get 503.
  void cancel_all();
  const SchedulerOptions& scheduler_options() const { return scheduler_.options(); }

 private:
  class JobSink;
  void loop();
  void finish_cancelled(GenerationJob& job);  // a job whose client left before it ran
  void job_done(GenerationJob* job);
  void publish_cache_stats();

  Metrics& metrics_;
  size_t max_queue_;
  Scheduler scheduler_;  // engine thread only
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<GenerationJob>> queue_;
  std::vector<GenerationJob*> live_;  // handed to the scheduler, not finished
  bool stopping_ = false;
  bool refusing_ = false;  // after cancel_all()
  std::thread thread_;
};

}  // namespace lathe::server
