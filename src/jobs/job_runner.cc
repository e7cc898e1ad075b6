#include "jobs/job_runner.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "common/os_error.h"
#include "jobs/event_log.h"
#include "jobs/job_api.h"
#include "jobs/kinds.h"

namespace lathe::jobs {
namespace {

using Clock = std::chrono::steady_clock;

std::string self_executable() {
  std::error_code ec;
  const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("lathe") : p.string();
}

// The highest descriptor number a child may have inherited, read before the fork (getrlimit is not on the
// async-signal-safe list).
int descriptor_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return 1 << 20;
  return static_cast<int>(std::min<rlim_t>(rl.rlim_cur, rlim_t{1} << 20));
}

// In the child before exec: every descriptor above stderr ends. The server's sockets are not close-on-exec (Asio
// accepts without it): a child holding a copy of a client's kept-alive connection keeps it open after the server
// closes it, no FIN goes out, and the client's next request on it waits until the job ends (a browser's Cancel
// button hung that way for as long as the job ran). The same for the listening socket and open files.
void close_inherited_descriptors(int limit) {
#ifdef SYS_close_range
  if (::syscall(SYS_close_range, 3U, ~0U, 0U) == 0) return;  // Linux 5.9 and later
#endif
  for (int fd = 3; fd < limit; ++fd) ::close(fd);
}

std::string exit_description(int status) {
  if (WIFEXITED(status)) return "the job process exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = sigabbrev_np(sig);
    return "the job process was killed by signal " + std::to_string(sig) +
           (name ? std::string(" (SIG") + name + ")" : "");
  }
  return "the job process ended abnormally";
}

// The child's last line of output, for the failure message: "job store: database or disk is full" says more
// than an exit code.
void note_line(std::string& last, const std::string& line) {
  size_t b = 0, e = line.size();
  while (b < e && std::isspace(static_cast<unsigned char>(line[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(line[e - 1]))) --e;
  if (b == e) return;
  constexpr size_t kMaxShown = 500;
  last = line.substr(b, std::min(e - b, kMaxShown));
}

}  // namespace

JobRunner::JobRunner(RunnerOptions options) : options_(std::move(options)) {
  if (options_.executable.empty()) options_.executable = self_executable();
  store_ = std::make_shared<JobStore>(options_.data_dir);
  const std::string lock_path = options_.data_dir + "/server.lock";
  lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) throw OsError("cannot open " + lock_path, errno);
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    char pid[32] = {};
    [[maybe_unused]] const ssize_t n = ::pread(lock_fd_, pid, sizeof pid - 1, 0);
    ::close(lock_fd_);
    lock_fd_ = -1;
    throw Error(ErrorKind::Io, "the job data directory " + options_.data_dir +
                                   " is in use by another lathe server (pid " + std::string(pid) +
                                   "); give this one its own --data-dir");
  }
  const std::string me = std::to_string(::getpid());
  if (::ftruncate(lock_fd_, 0) == 0) [[maybe_unused]]
    const ssize_t n = ::pwrite(lock_fd_, me.data(), me.size(), 0);
  for (const JobRow& row : store_->list(1 << 30)) {
    if (is_terminal(row.status)) continue;
    close_job(row, JobStatus::Zombie, "the server that ran this job stopped before it finished");
    log::warn("job " + row.id + " (" + row.kind + ") was left " + status_name(row.status) +
              " by a server that stopped: marked zombie");
    try {
      if (!find_kind(row.kind).resumable) continue;
      const JobRow again = submit(row.kind, json::parse(row.config_json));
      log::info("job " + row.id + " (" + row.kind + ") queued again as " + again.id + " to resume");
    } catch (const std::exception& e) {
      log::warn("job " + row.id + " (" + row.kind + ") cannot be resumed: " + e.what());
    }
  }
  worker_ = std::thread([this] { work(); });
}

JobRunner::~JobRunner() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    if (current_pid_ > 0) {
      cancel_current_ = true;
      ::kill(current_pid_, SIGTERM);
    }
  }
  cv_.notify_all();
  worker_.join();
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the lock
}

JobRow JobRunner::submit(const std::string& kind, const json& config) {
  find_kind(kind).validate(config);
  return submit_validated(kind, config);
}

JobRow JobRunner::submit_validated(const std::string& kind, const json& config) {
  JobRow row = store_->create(kind, config);
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(row.id);
  }
  cv_.notify_all();
  return row;
}

JobRow JobRunner::cancel(const std::string& id) {
  auto row = store_->get(id);
  if (!row) throw Error(ErrorKind::NotFound, "no job " + id);
  std::unique_lock<std::mutex> lock(mu_);
  if (current_ == id) {
    if (!cancel_current_ && current_pid_ > 0) {
      cancel_current_ = true;
      ::kill(current_pid_, SIGTERM);  // the worker escalates to SIGKILL after the grace period
    }
    return *row;
  }
  if (row->status == JobStatus::Queued) {
    for (auto it = queue_.begin(); it != queue_.end(); ++it)
      if (*it == id) {
        queue_.erase(it);
        break;
      }
    lock.unlock();
    close_job(*row, JobStatus::Cancelled, "cancelled before it started");
  }
  return *store_->get(id);
}

bool JobRunner::stop(const std::string& id) {
  auto row = store_->get(id);
  if (!row) throw Error(ErrorKind::NotFound, "no job " + id);
  if (!find_kind(row->kind).stoppable)
    throw Error(ErrorKind::InvalidArgument,
                "a " + row->kind + " job cannot stop early and keep its work; cancel it instead");
  // A row already ended is not stopped, even while its process is still being reaped.
  if (row->status != JobStatus::Running) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (current_ != id || current_pid_ <= 0 || cancel_current_) return false;
  ::kill(current_pid_, SIGUSR1);
  return true;
}

// Appends the closing event, then flips the row: readers that see the terminal status have the whole log.
bool JobRunner::try_close(PendingClose& p) {
  if (!p.event_written) {
    try {
      append_event(p.row.log_path, failed_event(p.error, p.status));
      p.event_written = true;
    } catch (const std::exception&) {
      // Retried with the status below; the status alone still ends the job.
    }
  }
  try {
    store_->finish(p.row.id, p.status, p.error);  // false (already terminal) also ends the retries
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

void JobRunner::close_job(const JobRow& row, JobStatus status, const std::string& error) {
  PendingClose p{row, status, error, false};
  if (try_close(p)) return;
  log::warn("job " + row.id + ": cannot write its " + status_name(status) + " status (" + error +
            "); retrying every second until the disk takes it");
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_closes_.push_back(std::move(p));
  }
  cv_.notify_all();
}

void JobRunner::retry_pending_closes() {
  std::vector<PendingClose> todo;
  {
    std::lock_guard<std::mutex> lock(mu_);
    todo.swap(pending_closes_);
  }
  if (todo.empty()) return;
  std::vector<PendingClose> left;
  for (PendingClose& p : todo) {
    if (try_close(p))
      log::info("job " + p.row.id + ": its " + status_name(p.status) + " status is written");
    else
      left.push_back(std::move(p));
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (PendingClose& p : left) pending_closes_.push_back(std::move(p));
}

void JobRunner::work() {
  while (true) {
    retry_pending_closes();
    std::string id;
    {
      std::unique_lock<std::mutex> lock(mu_);
      const auto ready = [this] { return stopping_ || !queue_.empty(); };
      if (pending_closes_.empty())
        cv_.wait(lock, ready);
      else
        cv_.wait_for(lock, std::chrono::seconds(1), ready);
      if (stopping_) return;
      if (queue_.empty()) continue;  // a second passed: retry the pending closes
      id = queue_.front();
      queue_.pop_front();
      current_ = id;
      cancel_current_ = false;
    }
    try {
      run_one(id);
    } catch (const std::exception& e) {
      log::error("job " + id + ": " + e.what());
    }
    std::lock_guard<std::mutex> lock(mu_);
    current_.clear();
    current_pid_ = 0;
  }
}

void JobRunner::run_one(const std::string& id) {
  const auto row = store_->get(id);
  if (!row || row->status != JobStatus::Queued) return;  // cancelled meanwhile

  const std::vector<std::string> args = {options_.executable, "job-run", "--data-dir", options_.data_dir, id};
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // The child's environment: this process's, with the serving server's own API (job_api.h) in place of any
  // inherited one; built before the fork (the child may only make async-signal-safe calls).
  std::vector<std::string> env_text;
  const auto api = job_api_env();
  for (char** e = environ; e && *e; ++e) {
    const std::string_view entry(*e);
    if (!api.empty() &&
        (entry.starts_with(std::string(kJobApiUrlEnv) + "=") || entry.starts_with(std::string(kJobApiKeyEnv) + "=")))
      continue;
    env_text.emplace_back(entry);
  }
  for (const auto& [name, value] : api) env_text.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (auto& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw OsError("pipe", errno);
  const pid_t parent = ::getpid();
  const int fd_limit = descriptor_limit();
  // SIGUSR1 (a stop request) is blocked from the fork on: a request sent the moment the pid is known must find it
  // blocked in the child, never its default action (which kills). The child keeps it blocked across exec.
  sigset_t usr1, before;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  ::pthread_sigmask(SIG_BLOCK, &usr1, &before);
  const pid_t pid = ::fork();
  if (pid != 0) ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
  if (pid < 0) {
    ::close(out[0]);
    ::close(out[1]);
    close_job(*row, JobStatus::Failed, std::string("cannot start the job process: ") + std::strerror(errno));
    return;
  }
  if (pid == 0) {
    // Only async-signal-safe calls until exec. The child dies with this thread (kill -9 of the server), so
    // an orphan can never write over the zombie status the next server gives its row.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::setpriority(PRIO_PROCESS, 0, 10);
    // The server blocks SIGTERM for its sigwait thread; the child takes it. SIGUSR1 (a stop request) stays
    // blocked across exec, pending, until the child has its handler (jobs/stop_request.h).
    ::sigprocmask(SIG_SETMASK, &usr1, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    close_inherited_descriptors(fd_limit);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(out[1]);
  {
    std::lock_guard<std::mutex> lock(mu_);
    current_pid_ = pid;
    if (cancel_current_) ::kill(pid, SIGTERM);  // cancelled between pop and fork
  }

  // Read the child's output line by line until it closes its end; escalate a cancel after the grace period.
  std::string pending, last_line;
  std::optional<Clock::time_point> kill_at;
  bool eof = false;
  int status = 0;
  bool reaped = false;
  const size_t kMaxLine = 64 * 1024;
  while (!reaped) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cancel_current_ && !kill_at) kill_at = Clock::now() + std::chrono::milliseconds(options_.cancel_grace_ms);
    }
    if (kill_at && Clock::now() >= *kill_at) {
      ::kill(pid, SIGKILL);
      kill_at = Clock::time_point::max();
    }
    if (!eof) {
      pollfd p{out[0], POLLIN, 0};
      if (::poll(&p, 1, 100) > 0) {
        char buf[4096];
        const ssize_t n = ::read(out[0], buf, sizeof buf);
        if (n <= 0) {
          eof = true;
        } else {
          pending.append(buf, static_cast<size_t>(n));
          size_t nl;
          while ((nl = pending.find('\n')) != std::string::npos || pending.size() > kMaxLine) {
            const size_t cut = nl == std::string::npos ? kMaxLine : nl;
            const std::string line = pending.substr(0, cut);
            pending.erase(0, nl == std::string::npos ? cut : cut + 1);
            note_line(last_line, line);
            try {
              append_event(row->log_path, log_event(line));
            } catch (const std::exception& e) {
              log::warn("job " + id + ": " + e.what());
            }
          }
        }
      }
    } else {
      ::usleep(20 * 1000);
    }
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) reaped = true;
    if (w < 0 && errno != EINTR) break;
  }
  // Drain what the child wrote before it exited.
  char buf[4096];
  ssize_t n;
  while ((n = ::read(out[0], buf, sizeof buf)) > 0) pending.append(buf, static_cast<size_t>(n));
  ::close(out[0]);
  size_t start = 0;
  while (start < pending.size()) {
    size_t nl = pending.find('\n', start);
    if (nl == std::string::npos) nl = pending.size();
    const std::string line = pending.substr(start, nl - start);
    note_line(last_line, line);
    try {
      append_event(row->log_path, log_event(line));
    } catch (const std::exception&) {
    }
    start = nl + 1;
  }

  std::optional<JobRow> now;
  try {
    now = store_->get(id);
  } catch (const std::exception& e) {
    log::warn("job " + id + ": " + e.what());
    now = row;  // finish() leaves a row the child closed itself as it is
  }
  if (!now || is_terminal(now->status)) return;  // the child closed the job itself
  bool cancelled, stopping;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled = cancel_current_;
    stopping = stopping_;
  }
  if (cancelled)
    close_job(*now, JobStatus::Cancelled, stopping ? "cancelled: the server shut down" : "cancelled");
  else
    close_job(*now, JobStatus::Failed, exit_description(status) + (last_line.empty() ? "" : ": " + last_line));
}

}  // namespace lathe::jobs
