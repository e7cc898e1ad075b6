// main() of a benchmark program: a bad argument or an unreadable input ends the run with its message and exit
// status 1, not std::terminate.
#pragma once
#include <cstdio>
#include <exception>

namespace bench {

template <class Run>
int run_reporting_errors(const char* program, Run&& run) {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace bench
