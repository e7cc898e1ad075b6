// "Stop early and keep the work" (JobRunner::stop) as the job's process sees it: SIGUSR1 sets a flag that a
// stoppable kind polls (finetune, once a step). The runner starts each child with SIGUSR1 blocked, so a request
// that comes while the child is still starting stays pending until handle_stop_requests() has the handler in
// place; `lathe train` takes `kill -USR1` the same way.
#pragma once

namespace lathe::jobs {

// Installs the handler, then unblocks SIGUSR1 for the calling thread (a pending request is taken at once).
void handle_stop_requests();
// Whether a stop was requested since handle_stop_requests().
bool stop_requested();

}  // namespace lathe::jobs
