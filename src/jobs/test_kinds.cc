#include "jobs/test_kinds.h"

#include <chrono>
#include <cstdlib>
#include <thread>

#include "common/error.h"

namespace lathe::jobs {

JobKind noop_kind() {
  JobKind k;
  k.name = "noop";
  k.test_only = true;
  k.description = "reports `steps` stages `step_ms` apart and succeeds (for tests)";
  k.validate = [](const json& c) {
    check_fields(c, "noop", {"steps", "step_ms"});
    number_field(c, "steps", 2, 0, 100000);
    number_field(c, "step_ms", 0, 0, 600000);
  };
  k.run = [](const Emit& emit, const json& c) {
    const int steps = static_cast<int>(number_field(c, "steps", 2, 0, 100000));
    const int step_ms = static_cast<int>(number_field(c, "step_ms", 0, 0, 600000));
    emit(stage_event("warmup", 0.0, "starting"));
    for (int i = 0; i < steps; ++i) {
      if (step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
      emit(stage_event("work", static_cast<double>(i + 1) / (steps + 1),
                       "step " + std::to_string(i + 1) + " of " + std::to_string(steps)));
    }
    JobResult r;
    r.summary = {{"steps", steps}};
    return r;
  };
  return k;
}

JobKind crash_kind() {
  JobKind k;
  k.name = "crash";
  k.test_only = true;
  k.description = "reports one stage, then its process dies (for tests)";
  k.validate = [](const json& c) {
    check_fields(c, "crash", {"signal"});
    if (c.contains("signal") && !c["signal"].is_boolean())
      throw Error(ErrorKind::InvalidArgument, "config field 'signal' must be a boolean");
  };
  k.run = [](const Emit& emit, const json& c) -> JobResult {
    emit(stage_event("boom", 0.5, "about to crash"));
    if (c.value("signal", false)) std::abort();
    std::_Exit(3);
  };
  return k;
}

}  // namespace lathe::jobs
