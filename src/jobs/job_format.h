// One job event as a line of text for a terminal or a log file ("[stage 42%] quantizing: layers.3.mlp").
#pragma once
#include <string>

#include "jobs/job_types.h"

namespace lathe::jobs {

std::string format_event(const json& event);

// An Emit for jobs run in the foreground by their own verb (`lathe quantize`): a progress bar redrawn in place
// on a terminal, plain lines otherwise; `log` events and the terminal events always get their own line.
Emit terminal_emit(bool is_terminal);

}  // namespace lathe::jobs
