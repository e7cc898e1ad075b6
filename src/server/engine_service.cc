#include "server/engine_service.h"

#include <cstdio>

#include "common/log.h"
#include "server/api_error.h"

namespace lathe::server {

GenerationJob::GenerationJob(std::vector<int32_t> prompt, GenerateOptions options, std::string request_id)
    : prompt_(std::move(prompt)),
      options_(std::move(options)),
      request_id_(std::move(request_id)),
      received_(Clock::now()) {}

bool GenerationJob::wait(std::vector<TokenEvent>& out, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return finished_ || !events_.empty(); });
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

EngineService::EngineService(ChatSession& session, Metrics& metrics, size_t max_queue)
    : session_(session), metrics_(metrics), max_queue_(max_queue), thread_([this] { loop(); }) {}

EngineService::~EngineService() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    for (auto& job : queue_) job->cancel();
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<GenerationJob> EngineService::submit(std::vector<int32_t> prompt, GenerateOptions options,
                                                     std::string request_id) {
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

void EngineService::cancel_all() {
  std::lock_guard lock(mu_);
  refusing_ = true;
  for (auto& job : queue_) job->cancel_for_shutdown();
  if (running_) running_->cancel_for_shutdown();
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
  for (;;) {
    std::shared_ptr<GenerationJob> job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
      running_ = job;
      metrics_.set_queue_depth(static_cast<int64_t>(queue_.size()));
    }
    if (job->cancelled())
      finish_cancelled(*job);
    else
      run(*job);
    metrics_.add_in_flight(-1);
    std::lock_guard lock(mu_);
    running_.reset();
  }
}

void EngineService::run(GenerationJob& job) {
  using Clock = GenerationJob::Clock;
  GenerateOptions opt = job.options_;
  opt.cancel = &job.cancel_;
  Clock::time_point last;
  bool first = true;
  try {
    GenerateResult r = session_.generate(job.prompt_, opt, [&](const GeneratedToken& t) {
      const auto now = Clock::now();
      if (t.id >= 0) {
        if (first)
          metrics_.first_token(std::chrono::duration<double>(now - job.received_).count());
        else
          metrics_.inter_token(std::chrono::duration<double>(now - last).count());
        first = false;
        last = now;
      }
      job.push(TokenEvent{t.id, t.text, t.sample});
    });
    metrics_.tokens(job.prompt_.size(), r.tokens.size());
    if (log::level() <= log::Level::Debug) {
      char line[256];
      std::snprintf(line, sizeof line,
                    "request %s: prompt %d tokens (%d cached) at %.1f tok/s, %zu generated at %.1f tok/s",
                    job.request_id_.c_str(), r.prompt_tokens, r.cached_tokens, r.prompt_tps(), r.tokens.size(),
                    r.generation_tps());
      log::debug(line);
    }
    if (r.finish_reason == "cancelled" && job.shut_down()) {
      metrics_.cancelled();
      log::info("request " + job.request_id_ + ": cancelled by shutdown after " + std::to_string(r.tokens.size()) +
                " tokens");
    } else if (r.finish_reason == "cancelled") {
      metrics_.cancelled();
      log::info("request " + job.request_id_ + ": client went away, generation stopped after " +
                std::to_string(r.tokens.size()) + " tokens");
    }
    job.finish(std::move(r));
  } catch (const std::exception& e) {
    log::error("request " + job.request_id_ + ": generation failed: " + e.what());
    job.finish(GenerateResult{}, std::current_exception());
  }
}

}  // namespace lathe::server
