#include "jobs/emitter.h"

#include <algorithm>

#include "common/log.h"
#include "jobs/event_log.h"

namespace lathe::jobs {

Emit make_emit(std::shared_ptr<JobStore> store, const std::string& job_id, const std::string& log_path) {
  return [store, job_id, log_path](const json& event) noexcept {
    try {
      append_event(log_path, event);
      const std::string type = event.value("type", "");
      if (type != "stage" && type != "metric") return;
      std::optional<double> progress;
      std::optional<std::string> message;
      if (const auto p = event.find("progress"); p != event.end() && p->is_number())
        progress = std::clamp(p->get<double>(), 0.0, 1.0);
      if (const auto m = event.find("message"); m != event.end() && m->is_string()) message = m->get<std::string>();
      if (progress || message) store->set_progress(job_id, progress, message);
    } catch (const std::exception& e) {
      log::warn("job " + job_id + ": cannot record an event: " + e.what());
    }
  };
}

}  // namespace lathe::jobs
