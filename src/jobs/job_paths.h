// `serve --job-root DIR`: a server shared with key holders who should not reach every file its user can confines
// the files and folders jobs read and write to those roots. Without roots every path is allowed (a local
// server's operator is its only key holder).
#pragma once
#include <string>
#include <vector>

#include "jobs/kinds.h"

namespace lathe::jobs {

// Throws Error(InvalidArgument) naming the field (the jobs route answers it 403) when a path the config names
// (kind.path_fields, and any key ending in "_file") holds a ".." component, is relative, or resolves — symlinks of its
// existing part followed — outside every root. Non-string values are left to the kind's own validation.
void check_job_paths(const JobKind& kind, const json& config, const std::vector<std::string>& roots);

}  // namespace lathe::jobs
