// code_completion: a folder's .py files -> {"prompt", "completion"} rows, one per top-level def/class (with its
// decorators) of two lines or more, cut at a line drawn from a seeded generator: the prompt holds the lines
// before the cut (the signature at least), the completion the rest.
#pragma once
#include <cstdint>
#include <string>

#include "lab/dataset/generated.h"

namespace lathe::dataset {

struct CodeWalkLimits {
  int64_t max_files = 200;               // .py files read, in path order
  uint64_t max_file_bytes = 1u << 20;    // larger files are skipped (counted)
  uint64_t max_total_bytes = 64u << 20;  // the walk stops once this much was read
  int64_t max_entries = 200000;          // folder entries looked at
  int max_depth = 32;
};

// The files are found recursively under `dir` and taken in sorted path order; hidden entries (.git, .venv, ...),
// __pycache__, node_modules and site-packages are passed over; symbolic links to folders are not followed, and a linked
// file whose target lies outside `dir` is skipped (counted). Throws InvalidArgument when `dir` is not a folder.
// progress(files done, files to read).
Generated code_completion_rows(const std::string& dir, uint64_t seed, const CodeWalkLimits& limits,
                               const Progress& progress = {});

// The split of one file's text (exposed for tests): the rows its top-level blocks give.
std::vector<jobs::json> split_python_source(const std::string& source, uint64_t& rng_state);

}  // namespace lathe::dataset
