// The Emit a job reports through: appends each event to the job's log and mirrors stage/metric progress and
// messages onto its row. Never throws (a failing disk is logged; the job goes on).
#pragma once
#include <memory>
#include <string>

#include "jobs/job_store.h"

namespace lathe::jobs {

Emit make_emit(std::shared_ptr<JobStore> store, const std::string& job_id, const std::string& log_path);

}  // namespace lathe::jobs
