// The server's side of jobs: validates and queues submissions, runs them first in, first out, one at a time,
// each in its own `lathe job-run ID` child (a crash or an out-of-memory kill takes the job down, never the
// server), turns the child's stdout/stderr lines into `log` events, cancels with SIGTERM then SIGKILL, and asks a
// stoppable job to stop early with SIGUSR1 (ignored by the child until its kind handles it).
//
// Sharing the machine with serving: the child runs at nice 10, so under CPU contention the Linux scheduler
// gives the server's threads about nine tenths of the CPU and the job the rest (CFS weights 1024 vs 110).
//
// One server per data directory: the runner holds an exclusive lock on <data-dir>/server.lock for its life;
// a second one is refused. At start, rows a dead server left queued or running become zombie (their log
// gets a closing `failed` event with status zombie, then the row flips).
#pragma once
#include <sys/types.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "jobs/job_store.h"

namespace lathe::jobs {

struct RunnerOptions {
  std::string data_dir;
  std::string executable;  // the lathe binary to run `job-run` with (default: /proc/self/exe)
  int cancel_grace_ms = 3000;
};

class JobRunner {
 public:
  // Throws Error(Io) when another server holds the data directory.
  explicit JobRunner(RunnerOptions options);
  ~JobRunner();  // stops the worker; a running job is cancelled
  JobRunner(const JobRunner&) = delete;
  JobRunner& operator=(const JobRunner&) = delete;

  // Validates config for kind (throws InvalidArgument/Unsupported) and queues it.
  JobRow submit(const std::string& kind, const json& config);
  // Queues a config its caller has just validated with find_kind(kind).validate (the HTTP route does, to map its
  // errors): validating again would read a NAME_file input (up to 64 MiB) a second time.
  JobRow submit_validated(const std::string& kind, const json& config);
  // Cancels a queued or running job; returns the row (unchanged when already terminal). NotFound when absent.
  JobRow cancel(const std::string& id);
  // Asks the running job `id` to stop early and keep its work (its kind must be stoppable); false when it is not
  // the job running now (queued, ended, or between jobs). NotFound when absent, InvalidArgument for a kind that
  // cannot stop early.
  bool stop(const std::string& id);
  std::shared_ptr<JobStore> store() { return store_; }
  const std::string& data_dir() const { return options_.data_dir; }

 private:
  // A terminal status (and its closing event) that could not be written yet, e.g. on a full disk.
  struct PendingClose {
    JobRow row;
    JobStatus status;
    std::string error;
    bool event_written = false;
  };
  void work();
  void run_one(const std::string& id);
  // Writes the closing event, then the terminal status; what fails is kept and retried every second by the
  // worker until it is written, so a job never stays queued or running because of one failed write.
  void close_job(const JobRow& row, JobStatus status, const std::string& error);
  // Tries to finish p; false when a write failed (p then says what is left).
  bool try_close(PendingClose& p);
  void retry_pending_closes();
  RunnerOptions options_;
  int lock_fd_ = -1;
  std::shared_ptr<JobStore> store_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;
  std::vector<PendingClose> pending_closes_;  // guarded by mu_
  std::string current_;                       // the running job's id
  pid_t current_pid_ = 0;
  bool cancel_current_ = false;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace lathe::jobs
