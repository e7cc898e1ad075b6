// What the serving benchmarks share: `lathe serve` as a child process (stderr drained and scanned for the
// ready line) and a minimal raw-socket HTTP/1.1 POST client that hands over body bytes as they arrive.
#pragma once
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <regex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace bench {

using Clock = std::chrono::steady_clock;
inline double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// ---------------------------------------------------------------------------------------------------------
// `lathe serve` as a child process: stderr is drained by a thread (so logging never blocks the server) and
// scanned for the ready line. serve_subcommand false starts another server binary (a peer such as
// llama-server, which logs the same "listening on http://host:port" line once its model is loaded) with args alone.
class ServerProcess {
 public:
  ServerProcess(const std::string& lathe, const std::vector<std::string>& args, bool serve_subcommand = true) {
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
    std::vector<std::string> argv_s = {lathe};
    if (serve_subcommand) argv_s.push_back("serve");
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDERR_FILENO);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    started_ = Clock::now();
    const int rc = posix_spawn(&pid_, lathe.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (rc != 0) {
      close(fds[0]);
      throw std::runtime_error("cannot start " + lathe);
    }
    reader_ = std::thread([this, fd = fds[0]] { drain(fd); });
  }

  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      // 5 s to stop; 30 s when bench/host_sampler is preloaded (it writes its samples at exit).
      const int polls = std::getenv("LATHE_SAMPLE_OUT") ? 600 : 100;
      for (int i = 0; i < polls && waitpid(pid_, &status, WNOHANG) == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (waitpid(pid_, &status, WNOHANG) == 0) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
      }
    }
    if (reader_.joinable()) reader_.join();
  }

  // Blocks until the ready line (returns the port and the time from spawn to it) or the timeout.
  std::pair<int, double> wait_ready(double timeout_s) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (Clock::now() < deadline) {
      {
        std::lock_guard lock(mu_);
        if (port_ > 0) return {port_, seconds(started_, ready_at_)};
        if (eof_) break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    std::lock_guard lock(mu_);
    throw std::runtime_error("the server did not become ready; its log:\n" + log_);
  }

  pid_t pid() const { return pid_; }

  // The last 64 KiB the server logged (a peer's errors come late, after the head that log_ keeps).
  std::string log_tail() {
    std::lock_guard lock(mu_);
    return tail_;
  }

 private:
  void drain(int fd) {
    static const std::regex ready(R"(listening on http://[^\s:/]+:(\d+))");
    char buf[4096];
    std::string line;
    for (;;) {
      const ssize_t n = read(fd, buf, sizeof buf);
      if (n <= 0) break;
      const auto now = Clock::now();
      std::lock_guard lock(mu_);
      if (log_.size() < (1 << 20)) log_.append(buf, static_cast<size_t>(n));
      tail_.append(buf, static_cast<size_t>(n));
      if (tail_.size() > (64 << 10)) tail_.erase(0, tail_.size() - (64 << 10));
      if (port_ == 0) {
        line.append(buf, static_cast<size_t>(n));
        std::smatch m;
        if (std::regex_search(line, m, ready)) {
          port_ = std::stoi(m[1].str());
          ready_at_ = now;
        }
      }
    }
    close(fd);
    std::lock_guard lock(mu_);
    eof_ = true;
  }

  pid_t pid_ = -1;
  Clock::time_point started_, ready_at_;
  std::thread reader_;
  std::mutex mu_;
  std::string log_, tail_;
  int port_ = 0;
  bool eof_ = false;
};

// ---------------------------------------------------------------------------------------------------------
// A minimal HTTP/1.1 client over one loopback connection per request: Connection: close, chunked or
// Content-Length bodies. on_body sees the decoded body bytes as they arrive.
inline void http_request(int port, const std::string& method, const std::string& path, const std::string& body,
                         const std::function<void(const char*, size_t)>& on_body) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    throw std::runtime_error("connect failed");
  }
  const std::string req = method + " " + path +
                          " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\n"
                          "Content-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body;
  for (size_t off = 0; off < req.size();) {
    const ssize_t n = send(fd, req.data() + off, req.size() - off, MSG_NOSIGNAL);
    if (n <= 0) {
      close(fd);
      throw std::runtime_error("send failed");
    }
    off += static_cast<size_t>(n);
  }
  std::string in;  // bytes not consumed yet
  bool headers_done = false, chunked = false;
  size_t chunk_left = 0;  // bytes left in the current chunk (chunked mode)
  bool in_chunk = false;
  int status = 0;
  char buf[16384];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    in.append(buf, static_cast<size_t>(n));
    if (!headers_done) {
      const size_t end = in.find("\r\n\r\n");
      if (end == std::string::npos) continue;
      const std::string head = in.substr(0, end);
      status = std::atoi(head.c_str() + head.find(' ') + 1);
      std::string lower = head;
      std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
      chunked = lower.find("transfer-encoding: chunked") != std::string::npos;
      in.erase(0, end + 4);
      headers_done = true;
    }
    if (!chunked) {
      on_body(in.data(), in.size());
      in.clear();
      continue;
    }
    for (;;) {
      if (!in_chunk) {
        const size_t eol = in.find("\r\n");
        if (eol == std::string::npos) break;
        chunk_left = std::stoul(in.substr(0, eol), nullptr, 16);
        in.erase(0, eol + 2);
        in_chunk = true;
        if (chunk_left == 0) break;  // last chunk
      }
      const size_t take = std::min(chunk_left, in.size());
      on_body(in.data(), take);
      in.erase(0, take);
      chunk_left -= take;
      if (chunk_left > 0 || in.size() < 2) break;
      in.erase(0, 2);  // CRLF after the chunk data
      in_chunk = false;
    }
  }
  close(fd);
  if (status != 200) throw std::runtime_error("POST " + path + " answered " + std::to_string(status));
}

inline void http_post(int port, const std::string& path, const std::string& body,
                      const std::function<void(const char*, size_t)>& on_body) {
  http_request(port, "POST", path, body, on_body);
}

// GET a small body (e.g. /metrics) whole.
inline std::string http_get(int port, const std::string& path) {
  std::string out;
  http_request(port, "GET", path, "", [&](const char* p, size_t n) { out.append(p, n); });
  return out;
}

}  // namespace bench
