#include "jobs/job_types.h"

#include <chrono>

namespace lathe::jobs {

const char* status_name(JobStatus s) {
  switch (s) {
    case JobStatus::Queued: return "queued";
    case JobStatus::Running: return "running";
    case JobStatus::Done: return "done";
    case JobStatus::Failed: return "failed";
    case JobStatus::Cancelled: return "cancelled";
    case JobStatus::Zombie: return "zombie";
  }
  return "failed";
}

std::optional<JobStatus> parse_status(const std::string& name) {
  for (JobStatus s : {JobStatus::Queued, JobStatus::Running, JobStatus::Done, JobStatus::Failed, JobStatus::Cancelled,
                      JobStatus::Zombie})
    if (name == status_name(s)) return s;
  return std::nullopt;
}

bool is_terminal(JobStatus s) { return s != JobStatus::Queued && s != JobStatus::Running; }

namespace {
json opt(const std::optional<std::string>& v) { return v ? json(*v) : json(nullptr); }
}  // namespace

json to_json(const JobRow& r) {
  json config = nullptr;
  try {
    config = json::parse(r.config_json);
  } catch (const json::exception&) {
    config = r.config_json;  // stored by an older build as text: shown as it is
  }
  return {{"id", r.id},
          {"kind", r.kind},
          {"status", status_name(r.status)},
          {"config", config},
          {"progress", r.progress},
          {"message", opt(r.message)},
          {"log_path", r.log_path},
          {"output_path", opt(r.output_path)},
          {"error", opt(r.error)},
          {"started_at", r.started_at},
          {"ended_at", opt(r.ended_at)}};
}

int64_t now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

json started_event() { return {{"type", "started"}, {"ts", now_ms()}}; }

json log_event(const std::string& line) { return {{"type", "log"}, {"line", line}}; }

json stage_event(const std::string& stage, std::optional<double> progress, const std::string& message) {
  json e = {{"type", "stage"}, {"stage", stage}};
  if (progress) e["progress"] = *progress;
  if (!message.empty()) e["message"] = message;
  return e;
}

json done_event(const std::optional<std::string>& output_dir, const json& summary) {
  json e = {{"type", "done"}, {"ts", now_ms()}};
  if (output_dir) e["output_dir"] = *output_dir;
  if (!summary.is_null()) e["summary"] = summary;
  return e;
}

json failed_event(const std::string& error, JobStatus status) {
  json e = {{"type", "failed"}, {"error", error}, {"ts", now_ms()}};
  if (status != JobStatus::Failed) e["status"] = status_name(status);
  return e;
}

bool is_terminal_event(const json& e) {
  const auto t = e.find("type");
  return t != e.end() && t->is_string() && (*t == "done" || *t == "failed");
}

}  // namespace lathe::jobs
