// Waiting on a job's row in the store, for the job runner's end-to-end tests.
#pragma once
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "jobs/job_store.h"
#include "jobs/job_types.h"

namespace lathe::jobs {

// Offers the test job kinds (noop, crash) to this process and to the `lathe` processes it starts, which inherit
// the environment (servers, job children). Call before the first submission.
inline void offer_test_job_kinds() { ::setenv("LATHE_TEST_JOB_KINDS", "1", 1); }

// The job's row once it is terminal, or as it stands after timeout_ms (the caller's expectation then fails).
inline JobRow wait_terminal(JobStore& s, const std::string& id, int timeout_ms = 60000) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < until) {
    const JobRow r = *s.get(id);
    if (is_terminal(r.status)) return r;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return *s.get(id);
}

// Waits (up to 20 s) until the job's child has reported progress: it is running and past its start.
inline void wait_started(JobStore& s, const std::string& id) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (s.get(id)->progress == 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

}  // namespace lathe::jobs
