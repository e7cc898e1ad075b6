// `lathe job-run ID`: the child process that runs one job. It opens its own store connection, moves the row
// queued -> running, emits `started`, runs the kind's producer, then appends the terminal event (done or
// failed) before it flips the status, so a reader that sees a terminal status has the whole log.
#pragma once
#include <string>

namespace lathe::jobs {

// Returns the process exit status: 0 done, 1 failed, 2 the job could not be started (not found, not queued).
int run_job_child(const std::string& data_dir, const std::string& job_id);

}  // namespace lathe::jobs
