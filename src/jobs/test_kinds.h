// The built-in test kinds: `noop` walks through stages (config: steps, step_ms) and returns; `crash` reports
// one stage and then kills its own process (config: signal true for SIGABRT, else exit code 3), proving that
// a job's crash cannot take the server down.
#pragma once
#include "jobs/kinds.h"

namespace lathe::jobs {

JobKind noop_kind();
JobKind crash_kind();

}  // namespace lathe::jobs
