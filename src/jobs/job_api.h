// Where a job reaches the server that runs it: the server's own loopback base URL and its API key. `lathe serve`
// registers them once its port is bound; the job runner hands them to each `lathe job-run` child in the
// environment (LATHE_JOB_API_URL, LATHE_JOB_API_KEY), never in argv, the job's config or its log. The dataset
// job's LLM-driven templates call the served model through it.
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace lathe::jobs {

constexpr const char* kJobApiUrlEnv = "LATHE_JOB_API_URL";
constexpr const char* kJobApiKeyEnv = "LATHE_JOB_API_KEY";

struct JobApi {
  std::string url;  // "http://127.0.0.1:8080"
  std::string key;  // empty: the server takes no API key
};

// Called by the server once it listens (host as given to --host: a wildcard address becomes loopback).
void set_server_job_api(const std::string& host, int port, const std::string& key);
// The registered server's API in the server process; else the environment's (a job child); else none (a CLI run).
std::optional<JobApi> job_api();
// The environment entries a job child gets: the server's API when registered, nothing otherwise.
std::vector<std::pair<std::string, std::string>> job_api_env();

}  // namespace lathe::jobs
