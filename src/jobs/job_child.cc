#include "jobs/job_child.h"

#include <memory>

#include "common/error.h"
#include "common/log.h"
#include "jobs/emitter.h"
#include "jobs/event_log.h"
#include "jobs/job_store.h"
#include "jobs/kinds.h"
#include "jobs/stop_request.h"

namespace lathe::jobs {

int run_job_child(const std::string& data_dir, const std::string& job_id) {
  handle_stop_requests();  // before any thread starts, so each inherits the unblocked mask
  auto store = std::make_shared<JobStore>(data_dir);
  const auto row = store->get(job_id);
  if (!row) throw Error(ErrorKind::NotFound, "no job " + job_id + " in " + data_dir);
  if (!store->mark_running(job_id)) {
    log::warn("job " + job_id + " is " + status_name(store->get(job_id)->status) + ", not queued: not run");
    return 2;
  }
  const Emit emit = make_emit(store, job_id, row->log_path);
  emit(started_event());
  try {
    const JobKind& kind = find_kind(row->kind);
    const json config = json::parse(row->config_json);
    kind.validate(config);
    const JobResult result = kind.run(emit, config);
    append_event(row->log_path, done_event(result.output_path, result.summary));
    store->finish(job_id, JobStatus::Done, std::nullopt, result.output_path);
    return 0;
  } catch (const std::exception& e) {
    std::string name = "Error";
    if (const auto* err = dynamic_cast<const Error*>(&e)) name = error_kind_name(err->kind());
    const std::string message = name + ": " + e.what();
    emit(failed_event(message));
    store->finish(job_id, JobStatus::Failed, message);
    return 1;
  }
}

}  // namespace lathe::jobs
