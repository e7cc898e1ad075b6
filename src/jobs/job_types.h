// The job contract shared by the store, the runner and every producer (lab/quantize, lab/train, ...): the event
// grammar written one JSON object per line to a job's NDJSON log, the statuses a row goes through, and the
// shape of a producer. The grammar is mlx-bun's (started → log/stage/metric → done | failed) so its web
// wizards port over; `failed` also closes cancelled and zombie jobs (with a `status` field saying which).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace lathe::jobs {

using json = nlohmann::ordered_json;

enum class JobStatus { Queued, Running, Done, Failed, Cancelled, Zombie };

const char* status_name(JobStatus s);
std::optional<JobStatus> parse_status(const std::string& name);
bool is_terminal(JobStatus s);

// One persisted job (GET /api/jobs/{id}). Timestamps are UTC "YYYY-MM-DD HH:MM:SS"; started_at is the time
// the job was queued (the seed's column name).
struct JobRow {
  std::string id, kind;
  JobStatus status = JobStatus::Queued;
  std::string config_json;
  double progress = 0;
  std::optional<std::string> message, output_path, error, ended_at;
  std::string log_path, started_at;
};
json to_json(const JobRow& row);

// Events, built with the field names of the grammar. `ts` is epoch milliseconds.
int64_t now_ms();
json started_event();
json log_event(const std::string& line);
json stage_event(const std::string& stage, std::optional<double> progress = {}, const std::string& message = {});
json done_event(const std::optional<std::string>& output_dir, const json& summary = nullptr);
json failed_event(const std::string& error, JobStatus status = JobStatus::Failed);
// True for done and failed: the last event a job's log holds.
bool is_terminal_event(const json& e);

// The sink a producer reports through. Never throws: a logging failure must not kill a job.
using Emit = std::function<void(const json& event)>;

// What a producer returns; a failure is thrown (lathe::Error, its message becomes the `failed` event).
struct JobResult {
  std::optional<std::string> output_path;
  json summary = nullptr;
};

// The unit of work: runs to the end in the `lathe job-run` child (or in the foreground for a CLI verb).
using JobProducer = std::function<JobResult(const Emit& emit, const json& config)>;

}  // namespace lathe::jobs
