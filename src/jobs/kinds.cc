#include "jobs/kinds.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string_view>

#include "common/error.h"
#include "jobs/test_kinds.h"
#include "lab/dataset/dataset_job.h"
#include "lab/fuse/fuse_job.h"
#include "lab/quantize/quantize_job.h"
#include "lab/train/finetune_job.h"

namespace lathe::jobs {
namespace {

const std::vector<JobKind>& registry() {
  static const std::vector<JobKind> kinds = [] {
    std::vector<JobKind> k;
    k.push_back(lab::quantize_kind());
    k.push_back(lab::finetune_kind());
    k.push_back(lab::dataset_kind());
    k.push_back(lab::fuse_kind());
    k.push_back(noop_kind());
    k.push_back(crash_kind());
    return k;
  }();
  return kinds;
}

// Read on every lookup: a test may set it after an earlier lookup in the same process.
bool offered(const JobKind& k) {
  if (!k.test_only) return true;
  const char* env = std::getenv("LATHE_TEST_JOB_KINDS");
  return env && std::string_view(env) == "1";
}

}  // namespace

const JobKind& find_kind(const std::string& name) {
  for (const auto& k : registry())
    if (k.name == name && offered(k)) return k;
  std::string known;
  for (const auto& k : registry())
    if (offered(k)) known += (known.empty() ? "" : ", ") + k.name;
  throw Error(ErrorKind::InvalidArgument, "unknown job kind '" + name + "' (known: " + known + ")");
}

std::vector<std::string> kind_names() {
  std::vector<std::string> names;
  for (const auto& k : registry())
    if (offered(k)) names.push_back(k.name);
  return names;
}

void check_fields(const json& config, const std::string& kind, const std::vector<std::string>& known) {
  if (!config.is_object())
    throw Error(ErrorKind::InvalidArgument, "the config of a " + kind + " job must be an object");
  for (auto it = config.begin(); it != config.end(); ++it)
    if (std::find(known.begin(), known.end(), it.key()) == known.end()) {
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      throw Error(ErrorKind::InvalidArgument,
                  "unknown field '" + it.key() + "' in the config of a " + kind + " job (fields: " + list + ")");
    }
}

double number_field(const json& config, const std::string& key, double fallback, double lo, double hi) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  if (!it->is_number()) throw Error(ErrorKind::InvalidArgument, "config field '" + key + "' must be a number");
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) {
    auto text = [](double x) {  // 32, not 32.000000; 0.5 and 1e-06 as written
      std::ostringstream o;
      o << x;
      return o.str();
    };
    throw Error(ErrorKind::InvalidArgument,
                "config field '" + key + "' must be in [" + text(lo) + ", " + text(hi) + "]");
  }
  return v;
}

std::string string_field(const json& config, const std::string& key, const std::string& fallback) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  if (!it->is_string()) throw Error(ErrorKind::InvalidArgument, "config field '" + key + "' must be a string");
  return it->get<std::string>();
}

}  // namespace lathe::jobs
