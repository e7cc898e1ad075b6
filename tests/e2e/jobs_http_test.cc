// The jobs API of a real `lathe serve` (the demo model, a real data directory, real child processes): auth,
// validation before queuing, SSE replay with and without Last-Event-ID, a crash that leaves the server alive,
// kill -9 of the server mid-job -> zombie with its log intact, a second server on the same data directory, and
// `lathe jobs` against it.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/served_lathe.h"

#include "common/limits.h"
#include "support/job_test_util.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
const std::string kKey = "sekret";

struct Server : testutil::ServedLathe {
  explicit Server(const std::string& data_dir, const std::vector<std::string>& extra = {})
      : ServedLathe(data_dir, kKey, extra) {}
};

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("lathe_jobs_http_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

std::string submit(const Server& s, const json& body) {
  auto c = s.client();
  auto r = c.Post("/api/jobs", body.dump(), "application/json");
  if (!r || r->status != 201) return "";
  return json::parse(r->body)["job"]["id"];
}

json get_job(const Server& s, const std::string& id) {
  auto c = s.client();
  auto r = c.Get("/api/jobs/" + id);
  return r && r->status == 200 ? json::parse(r->body)["job"] : json();
}

json wait_status(const Server& s, const std::string& id, const std::string& until_not = "running") {
  for (int i = 0; i < 1500; ++i) {
    const json j = get_job(s, id);
    if (j.is_object() && j["status"] != "queued" && j["status"] != until_not) return j;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return get_job(s, id);
}

struct Frame {
  std::string id, event;
  json data;
};

std::vector<Frame> read_events(const Server& s, const std::string& id, const std::string& last_event_id = "") {
  auto c = s.client();
  httplib::Headers h;
  if (!last_event_id.empty()) h.emplace("Last-Event-ID", last_event_id);
  auto r = c.Get("/api/jobs/" + id + "/events", h);
  std::vector<Frame> frames;
  if (!r) return frames;
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  size_t start = 0;
  const std::string& b = r->body;
  while (start < b.size()) {
    size_t end = b.find("\n\n", start);
    if (end == std::string::npos) break;
    std::string block = b.substr(start, end - start);
    start = end + 2;
    Frame f;
    size_t pos = 0;
    while (pos < block.size()) {
      size_t nl = block.find('\n', pos);
      if (nl == std::string::npos) nl = block.size();
      const std::string line = block.substr(pos, nl - pos);
      if (line.rfind("id: ", 0) == 0) f.id = line.substr(4);
      if (line.rfind("event: ", 0) == 0) f.event = line.substr(7);
      if (line.rfind("data: ", 0) == 0) f.data = json::parse(line.substr(6));
      pos = nl + 1;
    }
    if (!f.data.is_null()) frames.push_back(f);
  }
  return frames;
}

TEST(JobsHttp, AuthValidationReplayCrashAndCli) {
  jobs::offer_test_job_kinds();
  TempDir d("api");
  Server s(d.path.string());
  ASSERT_GT(s.port, 0);
  auto anon = s.client(false);
  auto r = anon.Get("/api/jobs");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);

  auto c = s.client();
  r = c.Post("/api/jobs", R"({"kind":"paint"})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("unknown job kind 'paint'"), std::string::npos) << r->body;
  r = c.Post("/api/jobs", R"({"kind":"quantize","config":{"model":"/nonexistent","out":"/tmp/x"}})",
             "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_NE(r->body.find("/nonexistent"), std::string::npos) << r->body;
  // An output folder the server may not write is the config's fault (400 naming it), not the job store's; the
  // range of a numeric field reads as integers.
  r = c.Post("/api/jobs",
             json{{"kind", "quantize"},
                  {"config", {{"model", std::string(LATHE_SOURCE_DIR) + "/models/demo"}, {"out", "/proc/self/q4"}}}}
                 .dump(),
             "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("\"message\":\"quantize: the output's parent directory /proc/self is not writable"),
            std::string::npos)
      << r->body;
  EXPECT_NE(r->body.find("\"param\":\"config\""), std::string::npos) << r->body;
  r = c.Post("/api/jobs",
             json{{"kind", "quantize"},
                  {"config",
                   {{"model", std::string(LATHE_SOURCE_DIR) + "/models/demo"}, {"out", "/tmp/x"}, {"group_size", 0}}}}
                 .dump(),
             "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("'group_size' must be in [32, 128]"), std::string::npos) << r->body;
  r = c.Post("/api/jobs", R"({"kind":"dataset","config":{}})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("'template' is required"), std::string::npos) << r->body;
  r = c.Post("/api/jobs", R"({"kind":"finetune","config":{"data_dir":"d","adapter_path":"o"}})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("model_dir"), std::string::npos) << r->body;
  r = c.Post("/api/jobs", "{not json", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  // Hostile JSON gets the request limits as on every other route (this nesting overflowed the stack).
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  r = c.Post("/api/jobs", R"({"kind":"noop","config":)" + deep + "}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("nested deeper than"), std::string::npos) << r->body;
  // A config is paths and numbers: a megabyte of path would be kept in the row and in every listing.
  r = c.Post("/api/jobs",
             json{{"kind", "quantize"},
                  {"config",
                   {{"model", std::string(LATHE_SOURCE_DIR) + "/models/demo"},
                    {"out", d.path.string() + "/" + std::string(1 << 20, 'a')}}}}
                 .dump(),
             "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("a job's config may hold at most"), std::string::npos) << r->body;
  r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  r = c.Get("/api/jobs/job_nope");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);

  const std::string id = submit(s, {{"kind", "noop"}, {"config", {{"steps", 3}}}});
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(wait_status(s, id)["status"], "done");
  const auto all = read_events(s, id);
  ASSERT_GE(all.size(), 7u);  // started, 4 stages, done, end
  EXPECT_EQ(all.front().data["type"], "started");
  EXPECT_EQ(all[all.size() - 2].data["type"], "done");
  EXPECT_EQ(all.back().event, "end");
  for (size_t i = 0; i + 1 < all.size(); ++i) EXPECT_EQ(all[i].id, std::to_string(i + 1));
  const auto resumed = read_events(s, id, "2");
  ASSERT_EQ(resumed.size(), all.size() - 2);
  EXPECT_EQ(resumed.front().id, "3");
  EXPECT_EQ(resumed.front().data, all[2].data);
  // strtoull took "-5" (wrapped to a huge count: an empty replay) and "+2": only digits are an event number.
  for (const std::string bad : {"-5", "+2", "2x", "0x10", "99999999999999999999"}) {
    auto bad_r = c.Get("/api/jobs/" + id + "/events", httplib::Headers{{"Last-Event-ID", bad}});
    ASSERT_TRUE(bad_r);
    EXPECT_EQ(bad_r->status, 400) << bad;
    EXPECT_NE(bad_r->body.find("Last-Event-ID must be an event number"), std::string::npos) << bad_r->body;
  }

  const std::string crash = submit(s, {{"kind", "crash"}, {"config", json::object()}});
  const json failed = wait_status(s, crash);
  EXPECT_EQ(failed["status"], "failed");
  EXPECT_EQ(failed["error"], "the job process exited with code 3");
  r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);

  r = c.Get("/api/jobs?limit=1");
  ASSERT_TRUE(r);
  EXPECT_EQ(json::parse(r->body)["jobs"].size(), 1u);

  // The CLI against the same server.
  const std::string base =
      std::string(LATHE_BINARY) + " jobs --url http://127.0.0.1:" + std::to_string(s.port) + " --api-key " + kKey + " ";
  auto run = [](const std::string& cmd, int* status) {
    FILE* p = popen((cmd + " 2>&1").c_str(), "r");
    std::string out;
    std::array<char, 4096> buf{};
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
    *status = pclose(p);
    return out;
  };
  int status = 0;
  std::string out = run(base + "ls", &status);
  EXPECT_EQ(status, 0);
  EXPECT_NE(out.find(id), std::string::npos) << out;
  EXPECT_NE(out.find(crash), std::string::npos) << out;
  out = run(base + "logs " + id, &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("[work 75%] step 3 of 3"), std::string::npos) << out;
  out = run(base + "logs -f " + crash, &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("[failed] the job process exited with code 3"), std::string::npos) << out;
  out = run(base + "cancel job_nope", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("no job job_nope"), std::string::npos) << out;
}

TEST(JobsHttp, KillNineMidJobLeavesAZombieWithItsLogAndASecondServerIsRefused) {
  jobs::offer_test_job_kinds();
  TempDir d("zombie");
  std::string id;
  {
    Server s(d.path.string());
    ASSERT_GT(s.port, 0);
    id = submit(s, {{"kind", "noop"}, {"config", {{"steps", 1000}, {"step_ms", 50}}}});
    ASSERT_FALSE(id.empty());
    for (int i = 0; i < 500 && get_job(s, id)["progress"].get<double>() == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    {
      Server second(d.path.string());  // same data directory while the first lives: jobs refused, serving on
      ASSERT_GT(second.port, 0);
      auto c = second.client();
      auto r = c.Get("/api/jobs");
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 503);
      EXPECT_NE(r->body.find("in use by another lathe server"), std::string::npos) << r->body;
      EXPECT_EQ(c.Get("/health")->status, 200);
    }
    s.kill(SIGKILL);
  }
  Server again(d.path.string());
  ASSERT_GT(again.port, 0);
  const json j = get_job(again, id);
  EXPECT_EQ(j["status"], "zombie");
  const auto events = read_events(again, id);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events[0].data["type"], "started");
  EXPECT_EQ(events[1].data["stage"], "warmup");
  EXPECT_EQ(events[2].data["stage"], "work");
  EXPECT_EQ(events[events.size() - 2].data["status"], "zombie");
  // The orphaned job process died with its server: no step after the kill reached the log.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(read_events(again, id).size(), events.size());
}

TEST(JobsHttp, CancelOverHttpStopsARunningJob) {
  jobs::offer_test_job_kinds();
  TempDir d("cancel");
  Server s(d.path.string());
  ASSERT_GT(s.port, 0);
  const std::string id = submit(s, {{"kind", "noop"}, {"config", {{"steps", 1000}, {"step_ms", 50}}}});
  for (int i = 0; i < 500 && get_job(s, id)["status"] != "running"; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  auto c = s.client();
  auto r = c.Post("/api/jobs/" + id + "/cancel", "", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 202);
  EXPECT_EQ(wait_status(s, id)["status"], "cancelled");
  r = c.Delete("/api/jobs/" + id);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(c.Get("/api/jobs/" + id)->status, 404);
}

TEST(JobsHttp, TheQueueIsBounded) {
  jobs::offer_test_job_kinds();
  TempDir d("queue");
  Server s(d.path.string());
  ASSERT_GT(s.port, 0);
  const json slow = {{"kind", "noop"}, {"config", {{"steps", 1}, {"step_ms", 600000}}}};
  const std::string running = submit(s, slow);
  ASSERT_FALSE(running.empty());
  for (int i = 0; i < 500 && get_job(s, running)["status"] != "running"; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::string last;
  for (size_t i = 0; i < limits::kJobsMaxQueued; ++i) ASSERT_FALSE((last = submit(s, slow)).empty()) << i;
  auto c = s.client();
  auto r = c.Post("/api/jobs", slow.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429);
  EXPECT_NE(r->body.find("jobs are already queued"), std::string::npos) << r->body;
  // Room again once one leaves the queue.
  EXPECT_EQ(c.Post("/api/jobs/" + last + "/cancel", "", "application/json")->status, 202);
  EXPECT_FALSE(submit(s, slow).empty());
}

TEST(JobsHttp, ASubmitTheDiskCannotTakeIs507AndLeavesNoLog) {
  jobs::offer_test_job_kinds();
  ::signal(SIGXFSZ, SIG_IGN);  // inherited by the server: a write past its file size limit fails with EFBIG
  TempDir d("full");
  Server s(d.path.string());
  ASSERT_GT(s.port, 0);
  const auto logs = [&] {
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(d.path / "jobs")) n += e.path().extension() == ".ndjson";
    return n;
  };
  rlimit none{0, RLIM_INFINITY}, old{};
  ASSERT_EQ(::prlimit(s.pid, RLIMIT_FSIZE, &none, &old), 0);  // as on a full disk
  auto c = s.client();
  const json noop = {{"kind", "noop"}, {"config", json::object()}};
  auto r = c.Post("/api/jobs", noop.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 507) << r->body;
  EXPECT_NE(r->body.find("could not be recorded"), std::string::npos) << r->body;
  EXPECT_EQ(logs(), 0u);
  ASSERT_EQ(::prlimit(s.pid, RLIMIT_FSIZE, &old, nullptr), 0);
  const std::string id = submit(s, noop);
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(wait_status(s, id)["status"], "done");
  EXPECT_EQ(logs(), 1u);
  // Any other write the disk cannot take is a 507 as well (it was a 500 "internal error"): deleting the row.
  ASSERT_EQ(::prlimit(s.pid, RLIMIT_FSIZE, &none, nullptr), 0);
  auto del = c.Delete("/api/jobs/" + id);
  ASSERT_TRUE(del);
  EXPECT_EQ(del->status, 507) << del->body;
  EXPECT_NE(del->body.find("insufficient_storage"), std::string::npos) << del->body;
  ASSERT_EQ(::prlimit(s.pid, RLIMIT_FSIZE, &old, nullptr), 0);
  EXPECT_EQ(c.Delete("/api/jobs/" + id)->status, 200);
}

// A raw connection that asks to follow a job's events and reads until the stream has begun (or was refused).
struct Follower {
  int fd = -1;
  std::string got;
  Follower(int port, const std::string& id) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return;
    const std::string req =
        "GET /api/jobs/" + id + "/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + kKey + "\r\n\r\n";
    if (::send(fd, req.data(), req.size(), 0) != static_cast<ssize_t>(req.size())) return;
    char buf[4096];
    while (got.find("retry: 1500") == std::string::npos && got.find("\r\n\r\n{") == std::string::npos) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
  }
  ~Follower() {
    if (fd >= 0) ::close(fd);
  }
};

TEST(JobsHttp, FollowingStreamsLeaveWorkersForTheOtherRoutes) {
  jobs::offer_test_job_kinds();
  TempDir d("follow");
  // 16 workers, 8 of them for generations: 4 may follow job events.
  Server s(d.path.string(), {"--http-threads", "16", "--max-queue", "8"});
  ASSERT_GT(s.port, 0);
  const std::string id = submit(s, {{"kind", "noop"}, {"config", {{"steps", 1}, {"step_ms", 600000}}}});
  ASSERT_FALSE(id.empty());
  std::vector<std::unique_ptr<Follower>> followers;
  for (int i = 0; i < 4; ++i) {
    followers.push_back(std::make_unique<Follower>(s.port, id));
    EXPECT_NE(followers.back()->got.find("retry: 1500"), std::string::npos) << followers.back()->got;
  }
  // 300 of them took every worker: the other routes got 503 "every worker is taken".
  Follower refused(s.port, id);
  EXPECT_NE(refused.got.find("429"), std::string::npos) << refused.got;
  EXPECT_NE(refused.got.find("clients already follow job events"), std::string::npos) << refused.got;
  auto c = s.client();
  auto r = c.Get("/api/jobs/" + id + "/events?follow=0");  // a replay still answers
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  r = c.Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  // A follower that leaves gives its place back.
  followers.pop_back();
  bool again = false;
  for (int i = 0; i < 50 && !again; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    again = Follower(s.port, id).got.find("retry: 1500") != std::string::npos;
  }
  EXPECT_TRUE(again);
  EXPECT_EQ(c.Post("/api/jobs/" + id + "/cancel", "", "application/json")->status, 202);
}

}  // namespace
}  // namespace lathe
