// The job table in SQLite (WAL, so readers never block the writer). Every process that touches jobs (the
// server, each `lathe job-run` child, the CLI) opens its own JobStore on the same data directory:
//   <data-dir>/jobs.sqlite       the table (schema versioned with PRAGMA user_version, migrated on open)
//   <data-dir>/jobs/<id>.ndjson  one event log per job, the source of truth
#pragma once
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "jobs/job_types.h"

struct sqlite3;

namespace lathe::jobs {

// $XDG_DATA_HOME/lathe, else ~/.local/share/lathe.
std::string default_data_dir();

class JobStore {
 public:
  static constexpr int kSchemaVersion = 2;

  // Creates the directory, the database and the log folder as needed. Throws Error(Io) naming the path, or
  // Error(Unsupported) for a database written by a newer lathe.
  explicit JobStore(const std::string& data_dir);
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  const std::string& data_dir() const { return data_dir_; }

  // Inserts a queued row with a fresh id ("job_" + 16 hex digits) and creates its empty log.
  // Throws Error(Io) when either cannot be written (a full disk); the log is then removed.
  JobRow create(const std::string& kind, const json& config);
  std::optional<JobRow> get(const std::string& id);
  // Newest first; kind and status filter when not empty.
  std::vector<JobRow> list(int limit = 50, const std::string& kind = {}, const std::string& status = {});
  // Oldest first: the FIFO order of rows still queued.
  std::vector<std::string> queued_ids();

  // queued -> running; false when the row was not queued (cancelled meanwhile, or zombie).
  bool mark_running(const std::string& id);
  // Mirrors a stage/metric event's progress and message onto a running row.
  void set_progress(const std::string& id, std::optional<double> progress, const std::optional<std::string>& message);
  // Moves a non-terminal row to a terminal status (and ended_at); false when it was already terminal, so a
  // late writer never overwrites cancelled or zombie.
  bool finish(const std::string& id, JobStatus status, const std::optional<std::string>& error,
              const std::optional<std::string>& output_path = {});
  // Rows left queued/running by a server that died become zombie; returns their ids.
  std::vector<std::string> mark_zombies();
  // Deletes a terminal row and its log; false when absent. Throws InvalidArgument for a live job.
  bool remove(const std::string& id);

 private:
  void exec(const char* sql);
  void migrate();
  std::string data_dir_;
  sqlite3* db_ = nullptr;
  std::recursive_mutex mu_;  // one connection shared by the server's threads
};

}  // namespace lathe::jobs
