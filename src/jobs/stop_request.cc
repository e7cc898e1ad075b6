#include "jobs/stop_request.h"

#include <signal.h>

#include <atomic>

namespace lathe::jobs {
namespace stop_request_detail {

// Lock-free, so the handler may store to it.
std::atomic<bool> g_requested{false};
void on_stop_signal(int) { g_requested.store(true); }

}  // namespace stop_request_detail

void handle_stop_requests() {
  struct sigaction sa = {};
  sa.sa_handler = stop_request_detail::on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // reads and writes in flight go on
  ::sigaction(SIGUSR1, &sa, nullptr);
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  ::pthread_sigmask(SIG_UNBLOCK, &usr1, nullptr);
}

bool stop_requested() { return stop_request_detail::g_requested.load(); }

}  // namespace lathe::jobs
