// A job's NDJSON event log: the source of truth for what a job did. Each event is one line appended with a
// single write and flushed to disk before append() returns, so a crash keeps every event that was reported.
// Events are numbered from 1 by their line (the SSE event id).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "jobs/job_types.h"

namespace lathe::jobs {

// Appends one event (compact JSON + "\n"). Throws Error(Io) naming the log.
void append_event(const std::string& log_path, const json& event);
// Creates the log empty (or keeps an existing one).
void create_log(const std::string& log_path);

struct LogChunk {
  std::vector<json> events;  // complete lines after `offset`, parsed
  uint64_t next_offset = 0;  // byte offset after the last complete line read
};
// Reads the complete lines after byte `offset` (a trailing partial line is left for the next read; a line that
// is not JSON becomes a `log` event holding its text, so a damaged log still replays). Missing log: no events.
LogChunk read_events(const std::string& log_path, uint64_t offset = 0, size_t max_bytes = size_t{8} << 20);

}  // namespace lathe::jobs
