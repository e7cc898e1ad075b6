// The jobs API: POST /api/jobs, GET /api/jobs, GET /api/jobs/{id}, GET /api/jobs/{id}/events (server-sent
// events: the log replayed from the start, then followed; Last-Event-ID resumes; an `end` event closes),
// POST /api/jobs/{id}/cancel, POST /api/jobs/{id}/stop (a fine-tune stops early and writes its adapter) and
// DELETE /api/jobs/{id}. The runner lives as long as these routes; when the
// data directory cannot be used (another server holds it) the routes answer 503 and serving goes on.
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "common/error.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/os_error.h"
#include "jobs/event_log.h"
#include "jobs/job_paths.h"
#include "jobs/job_runner.h"
#include "jobs/job_store.h"
#include "jobs/kinds.h"
#include "server/http_server.h"
#include "server/json_fields.h"
#include "server/sse.h"

namespace lathe::server {
namespace {

using json = nlohmann::ordered_json;
constexpr const char* kPrefix = "/api/jobs/";
constexpr int kPollMs = 200;
// Set when the server stops: following streams close (without `end`, so an EventSource reconnects and resumes
// with Last-Event-ID).
std::atomic<bool> g_streams_stopping{false};

struct JobsState {
  std::unique_ptr<jobs::JobRunner> runner;
  std::string unavailable;  // why there is no runner
  // A following event stream holds a worker for as long as the job runs: they may take half of what the
  // generations (--max-queue) leave, so that they never starve the other routes.
  size_t max_followers = 1;
  std::atomic<size_t> followers{0};

  jobs::JobRunner& get() {
    if (!runner) throw ApiError(503, "the jobs API is unavailable: " + unavailable);
    return *runner;
  }
};

// "/api/jobs/ID[/tail]" -> {ID, tail}.
std::pair<std::string, std::string> split_job_path(const std::string& path) {
  const std::string rest = path.substr(std::string(kPrefix).size());
  const size_t slash = rest.find('/');
  if (slash == std::string::npos) return {rest, ""};
  return {rest.substr(0, slash), rest.substr(slash + 1)};
}

jobs::JobRow require_job(jobs::JobRunner& runner, const std::string& id) {
  auto row = runner.store()->get(id);
  if (!row) throw ApiError(404, "no job " + id, "id", "job_not_found");
  return *row;
}

int parse_limit(const std::string& text) {
  if (text.empty()) return 50;
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (*end != '\0' || v < 1 || v > 1000) throw ApiError(400, "limit must be an integer in [1, 1000]", "limit");
  return static_cast<int>(v);
}

// Streams the job's log: every event once, numbered by its line (the SSE id), from after `skip`.
void stream_events(std::shared_ptr<JobsState> state, const jobs::JobRow& row, uint64_t skip, bool follow,
                   httplib::Response& res) {
  // Taken only by a stream that will wait on a live job; given back when the response (its provider) goes.
  std::shared_ptr<void> slot;
  if (follow && !jobs::is_terminal(row.status)) {
    if (state->followers.fetch_add(1) >= state->max_followers) {
      state->followers.fetch_sub(1);
      throw ApiError(429, std::to_string(state->max_followers) +
                              " clients already follow job events; retry later or read them with ?follow=0");
    }
    slot = std::shared_ptr<void>(nullptr, [state](void*) { state->followers.fetch_sub(1); });
  }
  set_sse_headers(res);
  const auto provider = [state, row, skip, follow, slot](size_t, httplib::DataSink& sink) {
    if (!sse_send(sink, "retry: 1500\n\n")) return false;
    uint64_t offset = 0, index = 0;
    while (true) {
      // Read the status before the log: a terminal status means its closing event is already in the log.
      const auto now = state->runner->store()->get(row.id);
      const bool finished = !now || jobs::is_terminal(now->status) || !follow;
      bool saw_terminal = false;
      jobs::LogChunk chunk;
      do {
        chunk = jobs::read_events(row.log_path, offset);
        offset = chunk.next_offset;
        for (const auto& e : chunk.events) {
          ++index;
          saw_terminal = saw_terminal || jobs::is_terminal_event(e);
          if (index <= skip) continue;
          if (!sse_send(sink, "id: " + std::to_string(index) + "\n" + sse_frame(e))) return false;
        }
      } while (!chunk.events.empty() && finished);
      if (finished || saw_terminal) break;
      if (!sink.is_writable() || g_streams_stopping.load()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(kPollMs));
    }
    sse_send(sink, sse_frame(json::object(), "end"));
    sink.done();
    return true;
  };
  res.set_chunked_content_provider("text/event-stream", provider);
}

}  // namespace

void stop_job_streams() { g_streams_stopping.store(true); }

std::vector<Route> jobs_routes(ServerContext& ctx) {
  auto state = std::make_shared<JobsState>();
  const size_t workers = http_workers(ctx.options()), generations = ctx.options().max_queue;
  state->max_followers = std::max<size_t>(1, workers > generations ? (workers - generations) / 2 : 0);
  try {
    jobs::RunnerOptions o;
    o.data_dir = ctx.options().data_dir.empty() ? jobs::default_data_dir() : ctx.options().data_dir;
    state->runner = std::make_unique<jobs::JobRunner>(o);
    log::info("jobs: data directory " + o.data_dir);
  } catch (const std::exception& e) {
    state->unavailable = e.what();
    log::warn(std::string("jobs API disabled: ") + e.what());
  }

  std::vector<Route> r;
  const std::vector<std::string> roots = ctx.options().job_roots;
  r.push_back({"POST", "/api/jobs", [state, roots](const httplib::Request& req, httplib::Response& res) {
                 const json body = parse_json_body(req.body);
                 if (!body.contains("kind") || !body["kind"].is_string())
                   throw ApiError(400, "send {\"kind\": \"...\", \"config\": {...}}", "kind");
                 const json config = body.value("config", json::object());
                 if (const size_t bytes = config.dump().size(); bytes > limits::kJobConfigMaxBytes)
                   throw ApiError(400,
                                  "config is " + std::to_string(bytes) +
                                      " bytes of JSON; a job's config may hold at most " +
                                      std::to_string(limits::kJobConfigMaxBytes),
                                  "config");
                 jobs::JobRunner& runner = state->get();
                 const std::string kind = body["kind"].get<std::string>();
                 const jobs::JobKind& job_kind = jobs::find_kind(kind);  // an unknown kind is a 400
                 try {  // --job-root: paths outside the roots are refused before anything reads them
                   jobs::check_job_paths(job_kind, config, roots);
                 } catch (const Error& e) {
                   throw ApiError(403, e.what(), "config");
                 }
                 try {
                   // The config first, apart from the store: an output folder the server may not write is the
                   // request's problem (400, with the OS's reason), not a fault of the job data directory.
                   job_kind.validate(config);
                 } catch (const OsError& e) {
                   if (api_error_from(e).status() == 503) throw;
                   throw ApiError(400, e.what(), "config", api_error_from(e).code());
                 }
                 jobs::JobRow row;
                 try {
                   // Jobs run one at a time, so a queue without end only grows the table. Concurrent submits may
                   // pass this check together: the overshoot is bounded by the HTTP workers.
                   if (runner.store()->queued_ids().size() >= limits::kJobsMaxQueued)
                     throw ApiError(429, std::to_string(limits::kJobsMaxQueued) +
                                             " jobs are already queued; wait for them or cancel some");
                   row = runner.submit_validated(kind, config);  // validated above
                 } catch (const Error& e) {
                   // The row or its log could not be written: the store has removed what it had made. A read-only
                   // or forbidden data directory says so; any other failed write is taken for a full disk.
                   if (e.kind() != ErrorKind::Io) throw;
                   if (api_error_from(e).status() == 503) throw;  // out of memory (ENOMEM) is not a full disk
                   const StorageFault fault = storage_fault_of(e);
                   if (fault == StorageFault::ReadOnly || fault == StorageFault::Denied) {
                     const ApiError mapped = api_error_from(e);
                     throw ApiError(mapped.status(),
                                    std::string("the job could not be recorded, nothing was queued: ") + mapped.what(),
                                    {}, mapped.code());
                   }
                   throw ApiError(507,
                                  std::string("the job could not be recorded, nothing was queued (is the disk "
                                              "holding the job data directory full?): ") +
                                      e.what(),
                                  {}, "insufficient_storage");
                 }
                 write_json(res, {{"ok", true}, {"job", jobs::to_json(row)}}, 201);
               }});
  r.push_back({"GET", "/api/jobs", [state](const httplib::Request& req, httplib::Response& res) {
                 const int limit = parse_limit(req.get_param_value("limit"));
                 json list = json::array();
                 for (const auto& row :
                      state->get().store()->list(limit, req.get_param_value("kind"), req.get_param_value("status")))
                   list.push_back(jobs::to_json(row));
                 write_json(res, {{"ok", true}, {"jobs", list}});
               }});
  r.push_back(
      {"GET", kPrefix,
       [state](const httplib::Request& req, httplib::Response& res) {
         const auto [id, tail] = split_job_path(req.path);
         jobs::JobRunner& runner = state->get();
         const jobs::JobRow row = require_job(runner, id);
         if (tail.empty()) return write_json(res, {{"ok", true}, {"job", jobs::to_json(row)}});
         if (tail != "events") throw ApiError(404, "not found: GET " + req.path);
         uint64_t skip = 0;
         if (const std::string last = req.get_header_value("Last-Event-ID"); !last.empty()) {
           // Digits only: strtoull takes a sign (and wraps "-5" to a huge count, an empty replay) and leading spaces.
           const bool digits =
               last.size() <= 19 && std::all_of(last.begin(), last.end(), [](char c) { return c >= '0' && c <= '9'; });
           if (!digits)
             throw ApiError(400, "Last-Event-ID must be an event number (0 or more), got '" + last.substr(0, 64) + "'");
           skip = std::strtoull(last.c_str(), nullptr, 10);
         }
         stream_events(state, row, skip, req.get_param_value("follow") != "0", res);
       },
       /*prefix=*/true});
  r.push_back({"POST", kPrefix,
               [state](const httplib::Request& req, httplib::Response& res) {
                 const auto [id, tail] = split_job_path(req.path);
                 if (tail != "cancel" && tail != "stop") throw ApiError(404, "not found: POST " + req.path);
                 jobs::JobRunner& runner = state->get();
                 const jobs::JobRow found = require_job(runner, id);
                 if (tail == "stop") {  // stop early and keep the work (a fine-tune writes its adapter)
                   // A kind that cannot stop early is the runner's InvalidArgument: a 400 with its words.
                   if (!runner.stop(id))
                     throw ApiError(409, "job " + id + " is " + jobs::status_name(found.status) +
                                             ": only a running job can stop early (cancel a queued one)");
                   write_json(res, {{"ok", true}, {"job", jobs::to_json(*runner.store()->get(id))}}, 202);
                   return;
                 }
                 const jobs::JobRow row = runner.cancel(id);
                 write_json(res, {{"ok", true}, {"job", jobs::to_json(row)}}, 202);
               },
               /*prefix=*/true});
  r.push_back({"DELETE", kPrefix,
               [state](const httplib::Request& req, httplib::Response& res) {
                 const auto [id, tail] = split_job_path(req.path);
                 if (!tail.empty()) throw ApiError(404, "not found: DELETE " + req.path);
                 jobs::JobRunner& runner = state->get();
                 const jobs::JobRow row = require_job(runner, id);
                 if (!jobs::is_terminal(row.status))
                   throw ApiError(409, "job " + id + " is " + jobs::status_name(row.status) + "; cancel it first");
                 runner.store()->remove(id);
                 write_json(res, {{"ok", true}, {"deleted", id}});
               },
               /*prefix=*/true});
  return r;
}

}  // namespace lathe::server
