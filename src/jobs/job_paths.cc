#include "jobs/job_paths.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "common/error.h"
#include "io/path_within.h"

namespace lathe::jobs {
namespace job_paths_detail {

namespace fs = std::filesystem;

// The path with symlinks of its existing part resolved ("" when the OS refuses even that).
std::string resolved(const std::string& path) {
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(fs::path(path), ec);
  return ec ? std::string() : p.string();
}

bool is_path_key(const JobKind& kind, const std::string& key) {
  return std::find(kind.path_fields.begin(), kind.path_fields.end(), key) != kind.path_fields.end() ||
         (key.size() > 5 && key.compare(key.size() - 5, 5, "_file") == 0);
}

}  // namespace job_paths_detail

void check_job_paths(const JobKind& kind, const json& config, const std::vector<std::string>& roots) {
  namespace d = job_paths_detail;
  if (roots.empty() || !config.is_object()) return;
  std::string listed;
  for (const auto& r : roots) listed += (listed.empty() ? "" : ", ") + r;
  for (auto it = config.begin(); it != config.end(); ++it) {
    if (!d::is_path_key(kind, it.key()) || !it->is_string()) continue;
    const std::string path = it->get<std::string>();
    const std::string field = "config field '" + it.key() + "'";
    if (path.empty()) continue;  // the kind's validation names a missing path
    if (!d::fs::path(path).is_absolute())
      throw Error(ErrorKind::InvalidArgument, field + ": give an absolute path inside the job roots (" + listed + ")");
    for (const auto& part : d::fs::path(path))
      if (part == "..") throw Error(ErrorKind::InvalidArgument, field + ": '" + path + "' must not contain '..'");
    const std::string real = d::resolved(path);
    bool inside = false;
    for (const auto& root : roots) inside = inside || (!real.empty() && io::path_within(real, d::resolved(root)));
    if (!inside)
      throw Error(ErrorKind::InvalidArgument,
                  field + ": '" + path + "' is outside the job roots (serve --job-root: " + listed + ")");
  }
}

}  // namespace lathe::jobs
