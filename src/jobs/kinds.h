// The job kinds: each validates its config before it is queued (a bad config is a 400, never a failed job)
// and runs in the `lathe job-run` child. Producers in lab/ register themselves here.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "jobs/job_types.h"

namespace lathe::jobs {

struct JobKind {
  std::string name;
  std::string description;
  // Throws Error(InvalidArgument) naming the bad field, or Error(Unsupported) for a kind not available.
  std::function<void(const json& config)> validate;
  JobProducer run;
  // A job of this kind left running by a server that stopped is queued again (same config) at the next start,
  // after its row is marked zombie: the producer picks up its own checkpoints (finetune).
  bool resumable = false;
  // A running job of this kind can be stopped early and keep its work (JobRunner::stop: SIGUSR1 to its child,
  // which finishes as done with what it has; finetune writes the adapter of the steps taken).
  bool stoppable = false;
  // Kinds that exist for the test suites (noop, crash): known only where LATHE_TEST_JOB_KINDS=1 is set, so a
  // served API offers no job that sleeps for minutes or kills its process on request.
  bool test_only = false;
  // Config keys that name files or folders the job reads or writes (keys ending in "_file" count too): under
  // `serve --job-root` each must resolve inside a root (job_paths.h).
  std::vector<std::string> path_fields;
};

// The kind named `name`; throws Error(InvalidArgument) listing the known kinds (test kinds only where enabled).
const JobKind& find_kind(const std::string& name);
std::vector<std::string> kind_names();

// Typed config access for validators: the field's value, or the default when absent; a wrong type or a value
// outside [lo, hi] throws InvalidArgument naming the field.
double number_field(const json& config, const std::string& key, double fallback, double lo, double hi);
std::string string_field(const json& config, const std::string& key, const std::string& fallback = {});
// Throws InvalidArgument when config is not an object or has a key outside `known`.
void check_fields(const json& config, const std::string& kind, const std::vector<std::string>& known);

}  // namespace lathe::jobs
