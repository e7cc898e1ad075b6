// lathe jobs ls|show|logs|cancel|stop|rm: the jobs API of a running `lathe serve`, from the terminal.
#include <httplib.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/verbs.h"
#include "common/error.h"
#include "jobs/job_format.h"

namespace lathe::cli {
namespace {

using json = nlohmann::ordered_json;

struct JobsFlags {
  std::string url = "http://127.0.0.1:8080";
  std::string api_key;
  std::string id, kind, status;
  int limit = 50;
  bool follow = false;
};

httplib::Client client(const JobsFlags& f) {
  httplib::Client c(f.url);
  if (!c.is_valid()) throw Error(ErrorKind::InvalidArgument, "--url " + f.url + " is not a valid http URL");
  std::string key = f.api_key;
  if (key.empty())
    if (const char* env = std::getenv("LATHE_API_KEY")) key = env;
  if (!key.empty()) c.set_bearer_token_auth(key);
  c.set_connection_timeout(5, 0);
  c.set_read_timeout(3600, 0);
  return c;
}

json check(const httplib::Result& r, const JobsFlags& f) {
  if (!r) throw Error(ErrorKind::Io, "cannot reach lathe serve at " + f.url + ": " + httplib::to_string(r.error()));
  json body;
  try {
    body = json::parse(r->body);
  } catch (const json::parse_error&) {
    body = json::object();
  }
  if (r->status >= 400) {
    std::string msg =
        body.contains("error") && body["error"].is_object() ? body["error"].value("message", r->body) : r->body;
    throw Error(r->status == 404 ? ErrorKind::NotFound : ErrorKind::InvalidArgument,
                "HTTP " + std::to_string(r->status) + ": " + msg);
  }
  return body;
}

int ls(const JobsFlags& f) {
  auto c = client(f);
  std::string path = "/api/jobs?limit=" + std::to_string(f.limit);
  if (!f.kind.empty()) path += "&kind=" + httplib::detail::encode_query_param(f.kind);
  if (!f.status.empty()) path += "&status=" + httplib::detail::encode_query_param(f.status);
  const json body = check(c.Get(path), f);
  std::printf("%-21s %-9s %-9s %5s  %-19s  %s\n", "ID", "KIND", "STATUS", "PROG", "QUEUED (UTC)", "MESSAGE");
  for (const auto& j : body["jobs"]) {
    std::string msg = j["error"].is_string() ? j["error"].get<std::string>()
                                             : (j["message"].is_string() ? j["message"].get<std::string>() : "");
    std::printf("%-21s %-9s %-9s %4.0f%%  %-19s  %s\n", j["id"].get<std::string>().c_str(),
                j["kind"].get<std::string>().c_str(), j["status"].get<std::string>().c_str(),
                j["progress"].get<double>() * 100, j["started_at"].get<std::string>().c_str(), msg.c_str());
  }
  return 0;
}

int show(const JobsFlags& f) {
  auto c = client(f);
  const json body = check(c.Get("/api/jobs/" + f.id), f);
  std::printf("%s\n", body["job"].dump(2).c_str());
  return 0;
}

int cancel(const JobsFlags& f) {
  auto c = client(f);
  const json body = check(c.Post("/api/jobs/" + f.id + "/cancel", "", "application/json"), f);
  std::printf("%s %s\n", f.id.c_str(), body["job"]["status"].get<std::string>().c_str());
  return 0;
}

int stop(const JobsFlags& f) {
  auto c = client(f);
  const json body = check(c.Post("/api/jobs/" + f.id + "/stop", "", "application/json"), f);
  std::printf("%s %s: stopping after its current step\n", f.id.c_str(),
              body["job"]["status"].get<std::string>().c_str());
  return 0;
}

int rm(const JobsFlags& f) {
  auto c = client(f);
  check(c.Delete("/api/jobs/" + f.id), f);
  std::printf("deleted %s\n", f.id.c_str());
  return 0;
}

// Prints each event of the SSE stream as a line; returns 0 when the job ended done, 1 otherwise.
int logs(const JobsFlags& f) {
  auto c = client(f);
  std::string buffer, status = "unknown";
  bool failed = false;
  auto res = c.Get(
      "/api/jobs/" + f.id + "/events" + (f.follow ? "" : "?follow=0"), httplib::Headers{},
      [&](const httplib::Response& r) {
        if (r.status >= 400) {
          failed = true;
          std::fprintf(stderr, "lathe: error: HTTP %d for job %s\n", r.status, f.id.c_str());
          return false;
        }
        return true;
      },
      [&](const char* data, size_t n) {
        buffer.append(data, n);
        size_t end;
        while ((end = buffer.find("\n\n")) != std::string::npos) {
          const std::string frame = buffer.substr(0, end);
          buffer.erase(0, end + 2);
          size_t pos = frame.find("data: ");
          if (pos == std::string::npos || frame.find("event: end") != std::string::npos) continue;
          try {
            const json e = json::parse(frame.substr(pos + 6));
            std::printf("%s\n", jobs::format_event(e).c_str());
            std::fflush(stdout);
            if (e.value("type", "") == "done") status = "done";
            if (e.value("type", "") == "failed") status = e.value("status", "failed");
          } catch (const json::exception&) {
          }
        }
        return true;
      });
  if (failed) return 1;
  if (!res) throw Error(ErrorKind::Io, "cannot reach lathe serve at " + f.url + ": " + httplib::to_string(res.error()));
  return status == "done" ? 0 : 1;
}

}  // namespace

Verb add_jobs(CLI::App& app) {
  auto f = std::make_shared<JobsFlags>();
  CLI::App* cmd = app.add_subcommand("jobs", "list, follow and cancel the jobs of a running lathe serve");
  cmd->fallthrough();
  cmd->require_subcommand(1);
  cmd->add_option("--url", f->url, "the server")->capture_default_str();
  cmd->add_option("--api-key", f->api_key, "the server's --api-key (default: $LATHE_API_KEY)");
  CLI::App* ls_cmd = cmd->add_subcommand("ls", "list jobs, newest first");
  ls_cmd->add_option("--kind", f->kind, "only this kind");
  ls_cmd->add_option("--status", f->status, "only this status");
  ls_cmd->add_option("--limit", f->limit, "at most this many")->check(CLI::Range(1, 1000));
  CLI::App* show_cmd = cmd->add_subcommand("show", "one job's row as JSON");
  show_cmd->add_option("id", f->id, "job id")->required();
  CLI::App* logs_cmd = cmd->add_subcommand("logs", "a job's events (exit 0 when it ended done)");
  logs_cmd->add_option("id", f->id, "job id")->required();
  logs_cmd->add_flag("-f,--follow", f->follow, "keep following until the job ends");
  CLI::App* cancel_cmd = cmd->add_subcommand("cancel", "cancel a queued or running job");
  cancel_cmd->add_option("id", f->id, "job id")->required();
  CLI::App* stop_cmd = cmd->add_subcommand("stop", "stop a running fine-tune early and keep its adapter");
  stop_cmd->add_option("id", f->id, "job id")->required();
  CLI::App* rm_cmd = cmd->add_subcommand("rm", "delete a finished job and its log");
  rm_cmd->add_option("id", f->id, "job id")->required();
  return {cmd, [f, ls_cmd, show_cmd, logs_cmd, cancel_cmd, stop_cmd, rm_cmd] {
            if (ls_cmd->parsed()) return ls(*f);
            if (show_cmd->parsed()) return show(*f);
            if (logs_cmd->parsed()) return logs(*f);
            if (cancel_cmd->parsed()) return cancel(*f);
            if (stop_cmd->parsed()) return stop(*f);
            if (rm_cmd->parsed()) return rm(*f);
            return 1;
          }};
}

}  // namespace lathe::cli
