// A real `lathe serve` child on the demo model (port 0, an API key, a data directory), for end-to-end tests
// that drive it over HTTP: it is started at construction, its port read from the log line that announces it,
// and it is stopped (SIGTERM, or kill()) and reaped at scope exit. LATHE_BINARY and LATHE_SOURCE_DIR come from
// the test target's compile definitions.
#pragma once
#include <httplib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <string>
#include <thread>
#include <vector>

namespace lathe::testutil {

struct ServedLathe {
  pid_t pid = -1;
  int port = 0;  // stays 0 when the server could not be started or never said where it listens
  std::string key;
  int read_timeout_s = 30;  // of the clients client() makes

  ServedLathe(const std::string& data_dir, std::string api_key, const std::vector<std::string>& extra = {})
      : key(std::move(api_key)) {
    const std::string model = std::string(LATHE_SOURCE_DIR) + "/models/demo";
    std::vector<std::string> args = {LATHE_BINARY, "serve",     "--model", model,        "--port",
                                     "0",          "--api-key", key,       "--data-dir", data_dir};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int fds[2];
    if (::pipe(fds) != 0) return;
    pid = ::fork();
    if (pid == 0) {
      ::dup2(fds[1], 2);
      ::close(fds[0]);
      ::execv(LATHE_BINARY, argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    std::string text;
    char buf[512];
    ssize_t n;
    while ((n = ::read(fds[0], buf, sizeof buf)) > 0) {
      text.append(buf, static_cast<size_t>(n));
      const std::string mark = "listening on http://127.0.0.1:";
      const size_t at = text.find(mark);
      if (at != std::string::npos && text.find('\n', at) != std::string::npos) {
        port = std::stoi(text.substr(at + mark.size()));
        break;
      }
    }
    // Keep draining the server's log so it never blocks on a full pipe.
    std::thread([fd = fds[0]] {
      char b[512];
      while (::read(fd, b, sizeof b) > 0) {
      }
      ::close(fd);
    }).detach();
  }
  ~ServedLathe() { kill(SIGTERM); }
  ServedLathe(const ServedLathe&) = delete;
  ServedLathe& operator=(const ServedLathe&) = delete;

  // Sends sig and reaps the server (once).
  void kill(int sig) {
    if (pid > 0) {
      ::kill(pid, sig);
      ::waitpid(pid, nullptr, 0);
      pid = -1;
    }
  }
  // A client of the server, with its key unless auth is false.
  httplib::Client client(bool auth = true) const {
    httplib::Client c("127.0.0.1", port);
    if (auth) c.set_bearer_token_auth(key);
    c.set_read_timeout(read_timeout_s, 0);
    return c;
  }
};

}  // namespace lathe::testutil
