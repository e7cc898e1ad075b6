// Running the lathe binary from a test and capturing what it prints.
#pragma once
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace lathe::testutil {

struct CliOutput {
  std::string out;
  int status;  // the exit code, or -1 when it did not exit normally (or could not start)
};

// `LATHE_BINARY args` through the shell; stderr is merged into out when asked, else discarded.
inline CliOutput run_lathe(const std::string& args, bool with_stderr) {
  const std::string cmd = std::string(LATHE_BINARY) + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  CliOutput o{"", -1};
  if (!p) return o;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) o.out.append(buf.data(), n);
  const int st = pclose(p);
  o.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return o;
}

}  // namespace lathe::testutil
