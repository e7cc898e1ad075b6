// The job store against the real SQLite: rows, FIFO order, terminal statuses that stick, zombie marking,
// migration of a version-1 database, and the NDJSON event log (partial lines, damaged lines).
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "common/error.h"
#include "jobs/event_log.h"
#include "jobs/job_store.h"
#include "jobs/kinds.h"

namespace lathe::jobs {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("lathe_jobs_" + std::to_string(::getpid()) + "_" + std::to_string(reinterpret_cast<uintptr_t>(this)));
    fs::remove_all(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

TEST(JobStore, CreatesQueuedRowsWithALogAndListsThemNewestFirst) {
  TempDir d;
  JobStore s(d.path.string());
  const JobRow a = s.create("noop", {{"steps", 1}});
  const JobRow b = s.create("crash", json::object());
  EXPECT_EQ(a.status, JobStatus::Queued);
  EXPECT_EQ(a.id.size(), 20u);
  EXPECT_EQ(a.id.rfind("job_", 0), 0u);
  EXPECT_NE(a.id, b.id);
  EXPECT_TRUE(fs::exists(a.log_path));
  EXPECT_EQ(json::parse(a.config_json)["steps"], 1);
  const auto rows = s.list();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].id, b.id);
  EXPECT_EQ(s.list(10, "noop").size(), 1u);
  EXPECT_EQ(s.queued_ids(), (std::vector<std::string>{a.id, b.id}));
  EXPECT_FALSE(s.get("job_missing").has_value());
}

TEST(JobStore, TerminalStatusesStickAndProgressMirrorsOnlyRunningRows) {
  TempDir d;
  JobStore s(d.path.string());
  const JobRow a = s.create("noop", json::object());
  s.set_progress(a.id, 0.5, std::string("ignored while queued"));
  EXPECT_EQ(s.get(a.id)->progress, 0);
  ASSERT_TRUE(s.mark_running(a.id));
  EXPECT_FALSE(s.mark_running(a.id));
  s.set_progress(a.id, 0.25, std::string("quarter"));
  s.set_progress(a.id, std::nullopt, std::string("message only"));
  EXPECT_DOUBLE_EQ(s.get(a.id)->progress, 0.25);
  EXPECT_EQ(*s.get(a.id)->message, "message only");
  ASSERT_TRUE(s.finish(a.id, JobStatus::Cancelled, std::string("cancelled")));
  EXPECT_FALSE(s.finish(a.id, JobStatus::Done, std::nullopt, std::string("/out")));
  const JobRow r = *s.get(a.id);
  EXPECT_EQ(r.status, JobStatus::Cancelled);
  EXPECT_TRUE(r.ended_at.has_value());
  EXPECT_FALSE(r.output_path.has_value());
  EXPECT_THROW(s.remove(s.create("noop", json::object()).id), Error);  // live rows are cancelled first
  EXPECT_TRUE(s.remove(a.id));
  EXPECT_FALSE(fs::exists(r.log_path));
}

TEST(JobStore, MarksRowsLeftLiveAsZombieAndTwoConnectionsSeeEachOther) {
  TempDir d;
  std::string running, queued;
  {
    JobStore s(d.path.string());
    running = s.create("noop", json::object()).id;
    queued = s.create("noop", json::object()).id;
    s.mark_running(running);
  }
  JobStore s1(d.path.string()), s2(d.path.string());
  EXPECT_EQ(s1.mark_zombies(), (std::vector<std::string>{running, queued}));
  EXPECT_EQ(s2.get(running)->status, JobStatus::Zombie);
  EXPECT_EQ(s2.get(queued)->status, JobStatus::Zombie);
}

TEST(JobStore, MigratesAVersionOneDatabaseAndRefusesANewerOne) {
  TempDir d;
  fs::create_directories(d.path);
  const std::string db_path = (d.path / "jobs.sqlite").string();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(db_path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "CREATE TABLE jobs (id TEXT PRIMARY KEY, kind TEXT NOT NULL, status TEXT NOT NULL,"
                         " config_json TEXT NOT NULL, progress REAL NOT NULL DEFAULT 0, message TEXT,"
                         " log_path TEXT NOT NULL, output_path TEXT, error TEXT,"
                         " started_at TEXT NOT NULL DEFAULT (datetime('now')), ended_at TEXT);"
                         "INSERT INTO jobs (id, kind, status, config_json, log_path) VALUES"
                         " ('job_old', 'noop', 'done', '{}', '/x.ndjson');"
                         "PRAGMA user_version=1;",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  {
    JobStore s(d.path.string());
    EXPECT_EQ(s.get("job_old")->status, JobStatus::Done);
    const JobRow n = s.create("noop", json::object());
    EXPECT_EQ(s.list()[0].id, n.id);  // the migrated row keeps its place before new ones
  }
  ASSERT_EQ(sqlite3_open(db_path.c_str(), &db), SQLITE_OK);
  sqlite3_exec(db, "PRAGMA user_version=99", nullptr, nullptr, nullptr);
  sqlite3_close(db);
  try {
    JobStore s(d.path.string());
    FAIL() << "a newer schema must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
    EXPECT_NE(std::string(e.what()).find("schema version 99"), std::string::npos);
  }
}

TEST(JobStore, UnwritableDataDirectoryIsAClearIoError) {
  try {
    JobStore s("/proc/lathe-no-such-dir");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Io);
    EXPECT_NE(std::string(e.what()).find("/proc/lathe-no-such-dir"), std::string::npos);
  }
}

TEST(EventLog, AppendsLinesAndReadsCompleteOnesFromAnOffset) {
  TempDir d;
  fs::create_directories(d.path);
  const std::string log = (d.path / "j.ndjson").string();
  EXPECT_TRUE(read_events(log).events.empty());  // no log yet: nothing
  append_event(log, started_event());
  append_event(log, stage_event("work", 0.5, "half"));
  LogChunk c = read_events(log);
  ASSERT_EQ(c.events.size(), 2u);
  EXPECT_EQ(c.events[1]["stage"], "work");
  EXPECT_EQ(c.events[1]["progress"], 0.5);
  {
    std::ofstream f(log, std::ios::app);
    f << "not json\n{\"type\":\"log\",\"li";  // a damaged line and a partial one being written
  }
  LogChunk next = read_events(log, c.next_offset);
  ASSERT_EQ(next.events.size(), 1u);
  EXPECT_EQ(next.events[0]["type"], "log");
  EXPECT_EQ(next.events[0]["line"], "not json");
  {
    std::ofstream f(log, std::ios::app);
    f << "ne\":\"x\"}\n";
  }
  LogChunk last = read_events(log, next.next_offset);
  ASSERT_EQ(last.events.size(), 1u);
  EXPECT_EQ(last.events[0]["line"], "x");
  EXPECT_TRUE(is_terminal_event(done_event(std::nullopt)));
  EXPECT_TRUE(is_terminal_event(failed_event("x", JobStatus::Zombie)));
  EXPECT_EQ(failed_event("x", JobStatus::Zombie)["status"], "zombie");
  EXPECT_FALSE(is_terminal_event(last.events[0]));
}

TEST(JobKinds, TestKindsAreOfferedOnlyWhereEnabled) {
  const char* was = std::getenv("LATHE_TEST_JOB_KINDS");
  const std::optional<std::string> saved = was ? std::optional<std::string>(was) : std::nullopt;
  ::unsetenv("LATHE_TEST_JOB_KINDS");
  for (const char* name : {"noop", "crash"}) {
    try {
      find_kind(name);
      ADD_FAILURE() << name << " is offered without LATHE_TEST_JOB_KINDS";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
      const std::string msg = e.what();
      const std::string known = msg.substr(msg.find("(known:"));
      EXPECT_EQ(known.find("noop"), std::string::npos) << msg;
      EXPECT_EQ(known.find("crash"), std::string::npos) << msg;
      EXPECT_NE(known.find("quantize"), std::string::npos) << msg;
    }
  }
  EXPECT_EQ(find_kind("quantize").name, "quantize");
  ::setenv("LATHE_TEST_JOB_KINDS", "1", 1);
  EXPECT_EQ(find_kind("noop").name, "noop");
  EXPECT_EQ(find_kind("crash").name, "crash");
  if (saved)
    ::setenv("LATHE_TEST_JOB_KINDS", saved->c_str(), 1);
  else
    ::unsetenv("LATHE_TEST_JOB_KINDS");
}

}  // namespace
}  // namespace lathe::jobs
