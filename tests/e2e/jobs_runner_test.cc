// The job runner with real `lathe job-run` child processes and the real SQLite: noop runs to done with its
// events in order, a crash fails the job and leaves the runner working, cancel stops a running job, queued
// jobs run first in first out, and a second runner on the same data directory is refused.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <thread>

#include "common/error.h"
#include "jobs/event_log.h"
#include "jobs/job_runner.h"
#include "support/job_test_util.h"

namespace lathe::jobs {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("lathe_runner_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

RunnerOptions options(const TempDir& d) { return {d.path.string(), LATHE_BINARY, 500}; }

std::vector<std::string> types(const std::vector<json>& events) {
  std::vector<std::string> t;
  for (const auto& e : events) t.push_back(e["type"]);
  return t;
}

TEST(JobRunner, NoopRunsToDoneWithItsEventsInOrder) {
  offer_test_job_kinds();
  TempDir d("noop");
  JobRunner r(options(d));
  const JobRow row = r.submit("noop", {{"steps", 2}});
  const JobRow end = wait_terminal(*r.store(), row.id);
  EXPECT_EQ(end.status, JobStatus::Done);
  EXPECT_DOUBLE_EQ(end.progress, 1.0);
  const auto events = read_events(end.log_path).events;
  EXPECT_EQ(types(events), (std::vector<std::string>{"started", "stage", "stage", "stage", "done"}));
  EXPECT_EQ(events.back()["summary"]["steps"], 2);
}

TEST(JobRunner, CrashFailsTheJobAndTheRunnerGoesOn) {
  offer_test_job_kinds();
  TempDir d("crash");
  JobRunner r(options(d));
  const JobRow exit_crash = r.submit("crash", json::object());
  const JobRow abort_crash = r.submit("crash", {{"signal", true}});
  const JobRow after = r.submit("noop", json::object());
  JobRow e = wait_terminal(*r.store(), exit_crash.id);
  EXPECT_EQ(e.status, JobStatus::Failed);
  EXPECT_EQ(*e.error, "the job process exited with code 3");
  e = wait_terminal(*r.store(), abort_crash.id);
  EXPECT_EQ(e.status, JobStatus::Failed);
  EXPECT_NE(e.error->find("SIGABRT"), std::string::npos) << *e.error;
  const auto events = read_events(e.log_path).events;
  EXPECT_EQ(events.back()["type"], "failed");
  EXPECT_EQ(events.back()["error"], *e.error);
  EXPECT_EQ(wait_terminal(*r.store(), after.id).status, JobStatus::Done);
}

TEST(JobRunner, CancelStopsARunningJobAndAQueuedOne) {
  offer_test_job_kinds();
  TempDir d("cancel");
  JobRunner r(options(d));
  const JobRow slow = r.submit("noop", {{"steps", 1000}, {"step_ms", 50}});
  const JobRow queued = r.submit("noop", json::object());
  wait_started(*r.store(), slow.id);
  EXPECT_EQ(r.cancel(queued.id).status, JobStatus::Cancelled);
  r.cancel(slow.id);
  const JobRow end = wait_terminal(*r.store(), slow.id);
  EXPECT_EQ(end.status, JobStatus::Cancelled);
  const auto events = read_events(end.log_path).events;
  EXPECT_EQ(events.back()["type"], "failed");
  EXPECT_EQ(events.back()["status"], "cancelled");
  EXPECT_EQ(read_events(r.store()->get(queued.id)->log_path).events.back()["status"], "cancelled");
  EXPECT_THROW(r.cancel("job_nope"), Error);
}

// A job process holds none of the server's descriptors: a client connection the server closes while a job runs
// ends at once (with a copy in the child, no FIN went out and the client's next request on the connection waited
// for the job to end). A socket pair stands in for the connection: its end is open, without close-on-exec, when
// the child starts.
TEST(JobRunner, AJobProcessHoldsNoneOfTheServersDescriptors) {
  offer_test_job_kinds();
  TempDir d("fds");
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  JobRunner r(options(d));
  const JobRow slow = r.submit("noop", {{"steps", 1000}, {"step_ms", 50}});
  wait_started(*r.store(), slow.id);
  ::close(pair[0]);  // the server closes the connection
  pollfd p{pair[1], POLLIN, 0};
  const int ready = ::poll(&p, 1, 5000);
  char byte = 0;
  const ssize_t got = ready > 0 ? ::read(pair[1], &byte, 1) : -1;
  EXPECT_EQ(ready, 1) << "the other end saw nothing within 5 s: the job process holds a copy";
  EXPECT_EQ(got, 0) << "end of stream expected";
  EXPECT_EQ(r.store()->get(slow.id)->status, JobStatus::Running) << "the job is still running";
  ::close(pair[1]);
  r.cancel(slow.id);
  EXPECT_EQ(wait_terminal(*r.store(), slow.id).status, JobStatus::Cancelled);
}

TEST(JobRunner, FiftyQueuedJobsCompleteFirstInFirstOut) {
  offer_test_job_kinds();
  TempDir d("fifo");
  JobRunner r(options(d));
  std::vector<std::string> ids;
  for (int i = 0; i < 50; ++i) ids.push_back(r.submit("noop", {{"steps", 0}}).id);
  int64_t previous_done = 0;
  for (const auto& id : ids) {
    const JobRow end = wait_terminal(*r.store(), id, 60000);
    ASSERT_EQ(end.status, JobStatus::Done) << id;
    const auto events = read_events(end.log_path).events;
    ASSERT_EQ(events.front()["type"], "started");
    const int64_t started = events.front()["ts"];
    EXPECT_GE(started, previous_done) << id << " started before the job queued ahead of it finished";
    previous_done = events.back()["ts"];
  }
}

TEST(JobRunner, QuantizeJobWritesItsOutputAndReportsStagesAndSummary) {
  offer_test_job_kinds();
  TempDir d("quantize");
  JobRunner r(options(d));
  const std::string out = (d.path / "qwen3-q4").string();
  EXPECT_THROW(r.submit("quantize",
                        {{"model", std::string(LATHE_FIXTURES_DIR) + "/models/qwen3-bf16"}, {"out", out}, {"bits", 7}}),
               Error);
  const JobRow row =
      r.submit("quantize",
               {{"model", std::string(LATHE_FIXTURES_DIR) + "/models/qwen3-bf16"}, {"out", out}, {"eval_tokens", 8}});
  const JobRow end = wait_terminal(*r.store(), row.id);
  ASSERT_EQ(end.status, JobStatus::Done) << end.error.value_or("");
  EXPECT_EQ(*end.output_path, out);
  EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
  const auto events = read_events(end.log_path).events;
  std::vector<std::string> stages;
  for (const auto& e : events)
    if (e["type"] == "stage") stages.push_back(e["stage"]);
  EXPECT_EQ(stages.front(), "starting");
  EXPECT_EQ(stages.back(), "done");
  EXPECT_EQ(events.back()["type"], "done");
  EXPECT_EQ(events.back()["summary"]["bits_per_weight"], 4.5);
  EXPECT_TRUE(events.back()["summary"]["kl"].contains("mean_kl"));
}

TEST(JobRunner, RejectsBadSubmissionsBeforeQueuingAndASecondRunner) {
  offer_test_job_kinds();
  TempDir d("bad");
  JobRunner r(options(d));
  EXPECT_THROW(r.submit("paint", json::object()), Error);
  EXPECT_THROW(r.submit("noop", {{"steps", "many"}}), Error);
  EXPECT_THROW(r.submit("noop", {{"colour", 1}}), Error);
  try {
    r.submit("dataset", json::object());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'template' is required"), std::string::npos);
  }
  try {
    r.submit("finetune", json::object());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("model_dir"), std::string::npos) << e.what();
  }
  EXPECT_THROW(r.submit("finetune", {{"model_dir", "/m"}, {"data_dir", "/d"}, {"adapter_path", "/o"}, {"rnak", 4}}),
               Error);
  EXPECT_TRUE(r.store()->list().empty());
  try {
    JobRunner second(options(d));
    FAIL() << "a second runner on one data dir must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in use by another lathe server"), std::string::npos);
  }
}

// Until lifted, no file of this process or of the job children it starts may grow: every write fails (EFBIG,
// with SIGXFSZ ignored), as on a full disk.
struct NoFileWrites {
  rlimit old{};
  NoFileWrites() {
    ::signal(SIGXFSZ, SIG_IGN);
    ::getrlimit(RLIMIT_FSIZE, &old);
    const rlimit none{0, old.rlim_max};
    ::setrlimit(RLIMIT_FSIZE, &none);
  }
  void lift() { ::setrlimit(RLIMIT_FSIZE, &old); }
  ~NoFileWrites() { lift(); }
};

TEST(JobRunner, AStatusThatCannotBeWrittenIsRetriedUntilTheDiskTakesIt) {
  offer_test_job_kinds();
  TempDir d("full");
  JobRunner r(options(d));
  const JobRow first = r.submit("noop", {{"steps", 40}, {"step_ms", 50}});
  const JobRow second = r.submit("noop", json::object());
  wait_started(*r.store(), first.id);
  {
    NoFileWrites full;
    // The first child started before: it ends its job itself. The second cannot mark its job running, exits,
    // and the runner cannot write the failure either.
    EXPECT_EQ(wait_terminal(*r.store(), first.id).status, JobStatus::Done);
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    EXPECT_EQ(r.store()->get(second.id)->status, JobStatus::Queued);
    full.lift();
    const JobRow end = wait_terminal(*r.store(), second.id, 10000);
    ASSERT_EQ(end.status, JobStatus::Failed);
    // The child's last line says why, not only its exit code.
    EXPECT_NE(end.error->find("the job process exited with code"), std::string::npos) << *end.error;
    EXPECT_NE(end.error->find("job store"), std::string::npos) << *end.error;
    const auto events = read_events(end.log_path).events;
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events.back()["type"], "failed");
    EXPECT_EQ(events.back()["error"], *end.error);
  }
  // The runner goes on.
  EXPECT_EQ(wait_terminal(*r.store(), r.submit("noop", json::object()).id).status, JobStatus::Done);
}

}  // namespace
}  // namespace lathe::jobs
