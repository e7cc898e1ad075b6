// A dataset job's output folder: checked before the job is queued, then written whole (train.jsonl and
// valid.jsonl in a hidden temporary folder beside it, renamed into place), so a failed or cancelled job never
// leaves a partial dataset under the name asked for.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "jobs/job_types.h"

namespace lathe::dataset {

using json = jobs::json;

// The 90/10 split in generation order: train takes the first max(1, floor(0.9 n)) rows, valid the rest; when
// that leaves valid empty it holds the last row again. Throws InvalidArgument for no rows.
struct Split {
  std::vector<json> train, valid;
};
Split split_rows(std::vector<json> rows);

// `out` must be a path that does not exist (or an empty folder) whose parent folder exists and may be written.
// Throws InvalidArgument naming the field, or OsError with the system's reason for an unwritable parent.
void check_output_dir(const std::string& out);

// Writes the split's two files into `out` (see above). Throws OsError on a failed write; nothing is left behind.
void write_dataset(const std::string& out, const Split& split);

// One row as a line of JSONL (invalid UTF-8 from the input is replaced, not refused).
std::string jsonl_line(const json& row);

}  // namespace lathe::dataset
