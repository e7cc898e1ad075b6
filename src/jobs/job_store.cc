#include "jobs/job_store.h"

#include <sqlite3.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "common/error.h"
#include "common/os_error.h"
#include "jobs/event_log.h"

namespace lathe::jobs {
namespace {

namespace fs = std::filesystem;

// The errno a failed SQLite call stands for, so the server can answer a full disk with 507. SQLite's own codes
// first (it reports ENOSPC as SQLITE_FULL, as it does its page limit); for an I/O error (EDQUOT, EFBIG, EIO
// are all "disk I/O error") the errno it recorded, else `after`: errno read right after the call (SQLite 3.40
// records none for a failed write, and the calls after it in the rollback succeed, leaving errno as it was).
int sqlite_errno(sqlite3* db, int rc, int after) {
  switch (rc & 0xff) {
    case SQLITE_FULL: return ENOSPC;
    case SQLITE_READONLY: return EROFS;
    case SQLITE_PERM: return EACCES;
    case SQLITE_IOERR:
    case SQLITE_CANTOPEN: {
      const int recorded = db ? sqlite3_system_errno(db) : 0;
      return recorded != 0 ? recorded : after;
    }
    default: return 0;
  }
}

// One prepared statement, finalized on scope exit; step() retries are left to the busy timeout.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) {
    if (sqlite3_prepare_v2(db, sql, -1, &s_, nullptr) != SQLITE_OK)
      throw Error(ErrorKind::Internal, std::string("job store: cannot prepare: ") + sqlite3_errmsg(db));
  }
  ~Stmt() { sqlite3_finalize(s_); }
  Stmt& bind(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.c_str(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& bind(int i, const std::optional<std::string>& v) {
    if (v) return bind(i, *v);
    sqlite3_bind_null(s_, i);
    return *this;
  }
  Stmt& bind(int i, double v) {
    sqlite3_bind_double(s_, i, v);
    return *this;
  }
  Stmt& bind(int i, int v) {
    sqlite3_bind_int(s_, i, v);
    return *this;
  }
  bool step() {
    errno = 0;
    const int rc = sqlite3_step(s_);
    const int after = errno;
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    throw OsError(sqlite_errno(db_, rc, after), std::string("job store: ") + sqlite3_errmsg(db_));
  }
  std::string text(int col) const {
    const unsigned char* t = sqlite3_column_text(s_, col);
    return t ? reinterpret_cast<const char*>(t) : "";
  }
  std::optional<std::string> opt_text(int col) const {
    if (sqlite3_column_type(s_, col) == SQLITE_NULL) return std::nullopt;
    return text(col);
  }
  double real(int col) const { return sqlite3_column_double(s_, col); }
  int changes() const { return sqlite3_changes(db_); }

 private:
  sqlite3* db_;
  sqlite3_stmt* s_ = nullptr;
};

constexpr const char* kColumns =
    "id, kind, status, config_json, progress, message, log_path, output_path, error, started_at, ended_at";

JobRow read_row(const Stmt& s) {
  JobRow r;
  r.id = s.text(0);
  r.kind = s.text(1);
  r.status = parse_status(s.text(2)).value_or(JobStatus::Failed);
  r.config_json = s.text(3);
  r.progress = s.real(4);
  r.message = s.opt_text(5);
  r.log_path = s.text(6);
  r.output_path = s.opt_text(7);
  r.error = s.opt_text(8);
  r.started_at = s.text(9);
  r.ended_at = s.opt_text(10);
  return r;
}

std::string new_job_id() {
  std::random_device rd;  // the kernel's CSPRNG
  static const char* hex = "0123456789abcdef";
  std::string id = "job_";
  for (int i = 0; i < 16; ++i) id += hex[rd() & 15];
  return id;
}

}  // namespace

std::string default_data_dir() {
  if (const char* x = std::getenv("XDG_DATA_HOME"); x && *x) return std::string(x) + "/lathe";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.local/share/lathe";
  return ".lathe";
}

JobStore::JobStore(const std::string& data_dir) : data_dir_(data_dir) {
  std::error_code ec;
  fs::create_directories(fs::path(data_dir) / "jobs", ec);
  if (ec) throw OsError("cannot create the job data directory " + data_dir, ec.value());
  const std::string path = data_dir + "/jobs.sqlite";
  errno = 0;
  if (const int rc = sqlite3_open_v2(path.c_str(), &db_,
                                     SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
      rc != SQLITE_OK) {
    const int err = sqlite_errno(db_, rc, errno);
    const std::string msg = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    db_ = nullptr;
    throw OsError(err, "cannot open the job database " + path + ": " + msg);
  }
  // Server, children and CLI write the same file: wait out each other's short transactions.
  sqlite3_busy_timeout(db_, 10000);
  try {
    exec("PRAGMA journal_mode=WAL");
    exec("PRAGMA synchronous=NORMAL");
    migrate();
  } catch (...) {
    sqlite3_close(db_);
    db_ = nullptr;
    throw;
  }
}

JobStore::~JobStore() { sqlite3_close(db_); }

void JobStore::exec(const char* sql) {
  char* err = nullptr;
  errno = 0;
  if (const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, &err); rc != SQLITE_OK) {
    const int after = errno;
    const std::string msg = err ? err : sqlite3_errmsg(db_);
    sqlite3_free(err);
    throw OsError(sqlite_errno(db_, rc, after), "job store (" + data_dir_ + "/jobs.sqlite): " + msg);
  }
}

// Each step moves the schema from version i to i+1 inside one transaction; steps are never edited once
// shipped, only appended.
void JobStore::migrate() {
  static const char* const kSteps[kSchemaVersion] = {
      // 0 -> 1: the seed's row shape.
      "CREATE TABLE IF NOT EXISTS jobs ("
      " id TEXT PRIMARY KEY, kind TEXT NOT NULL, status TEXT NOT NULL, config_json TEXT NOT NULL,"
      " progress REAL NOT NULL DEFAULT 0, message TEXT, log_path TEXT NOT NULL, output_path TEXT, error TEXT,"
      " started_at TEXT NOT NULL DEFAULT (datetime('now')), ended_at TEXT);"
      "CREATE INDEX IF NOT EXISTS idx_jobs_status_started ON jobs(status, started_at DESC);",
      // 1 -> 2: a monotonic queue order (started_at has one-second resolution, so FIFO ties need it).
      "ALTER TABLE jobs ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;"
      "UPDATE jobs SET seq = rowid;"
      "CREATE INDEX IF NOT EXISTS idx_jobs_seq ON jobs(seq);",
  };
  exec("BEGIN IMMEDIATE");
  try {
    int version = 0;
    {
      Stmt s(db_, "PRAGMA user_version");
      if (s.step()) version = static_cast<int>(s.real(0));
    }
    if (version > kSchemaVersion)
      throw Error(ErrorKind::Unsupported, "the job database " + data_dir_ + "/jobs.sqlite has schema version " +
                                              std::to_string(version) + ", newer than this lathe (" +
                                              std::to_string(kSchemaVersion) + ")");
    for (int v = version; v < kSchemaVersion; ++v) exec(kSteps[v]);
    if (version != kSchemaVersion) exec(("PRAGMA user_version=" + std::to_string(kSchemaVersion)).c_str());
    exec("COMMIT");
  } catch (...) {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
}

JobRow JobStore::create(const std::string& kind, const json& config) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  const std::string id = new_job_id();
  const std::string log_path = data_dir_ + "/jobs/" + id + ".ndjson";
  create_log(log_path);
  Stmt s(db_,
         "INSERT INTO jobs (id, kind, status, config_json, log_path, seq)"
         " VALUES (?1, ?2, 'queued', ?3, ?4, (SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs))");
  s.bind(1, id).bind(2, kind).bind(3, config.dump()).bind(4, log_path);
  try {
    s.step();
  } catch (...) {
    std::error_code ec;
    fs::remove(log_path, ec);  // no row points at it
    throw;
  }
  return *get(id);
}

std::optional<JobRow> JobStore::get(const std::string& id) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Stmt s(db_, (std::string("SELECT ") + kColumns + " FROM jobs WHERE id = ?1").c_str());
  s.bind(1, id);
  if (!s.step()) return std::nullopt;
  return read_row(s);
}

std::vector<JobRow> JobStore::list(int limit, const std::string& kind, const std::string& status) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Stmt s(db_, (std::string("SELECT ") + kColumns +
               " FROM jobs WHERE (?1 = '' OR kind = ?1) AND (?2 = '' OR status = ?2) ORDER BY seq DESC LIMIT ?3")
                  .c_str());
  s.bind(1, kind).bind(2, status).bind(3, limit);
  std::vector<JobRow> rows;
  while (s.step()) rows.push_back(read_row(s));
  return rows;
}

std::vector<std::string> JobStore::queued_ids() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Stmt s(db_, "SELECT id FROM jobs WHERE status = 'queued' ORDER BY seq");
  std::vector<std::string> ids;
  while (s.step()) ids.push_back(s.text(0));
  return ids;
}

bool JobStore::mark_running(const std::string& id) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Stmt s(db_, "UPDATE jobs SET status = 'running' WHERE id = ?1 AND status = 'queued'");
  s.bind(1, id);
  s.step();
  return s.changes() == 1;
}

void JobStore::set_progress(const std::string& id, std::optional<double> progress,
                            const std::optional<std::string>& message) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Stmt s(db_,
         "UPDATE jobs SET progress = COALESCE(?2, progress), message = COALESCE(?3, message)"
         " WHERE id = ?1 AND status = 'running'");
  s.bind(1, id);
  if (progress)
    s.bind(2, *progress);
  else
    s.bind(2, std::optional<std::string>());
  s.bind(3, message);
  s.step();
}

bool JobStore::finish(const std::string& id, JobStatus status, const std::optional<std::string>& error,
                      const std::optional<std::string>& output_path) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Stmt s(db_,
         "UPDATE jobs SET status = ?2, error = ?3, output_path = COALESCE(?4, output_path),"
         " progress = CASE WHEN ?2 = 'done' THEN 1 ELSE progress END, ended_at = datetime('now')"
         " WHERE id = ?1 AND status IN ('queued', 'running')");
  s.bind(1, id).bind(2, std::string(status_name(status))).bind(3, error).bind(4, output_path);
  s.step();
  return s.changes() == 1;
}

std::vector<std::string> JobStore::mark_zombies() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  std::vector<std::string> ids;
  {
    Stmt s(db_, "SELECT id FROM jobs WHERE status IN ('queued', 'running') ORDER BY seq");
    while (s.step()) ids.push_back(s.text(0));
  }
  for (const auto& id : ids)
    finish(id, JobStatus::Zombie, std::string("the server that ran this job stopped before it finished"));
  return ids;
}

bool JobStore::remove(const std::string& id) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  const auto row = get(id);
  if (!row) return false;
  if (!is_terminal(row->status))
    throw Error(ErrorKind::InvalidArgument, "job " + id + " is " + status_name(row->status) + "; cancel it first");
  Stmt s(db_, "DELETE FROM jobs WHERE id = ?1");
  s.bind(1, id);
  s.step();
  std::error_code ec;
  fs::remove(row->log_path, ec);
  return true;
}

}  // namespace lathe::jobs
