#include "jobs/job_api.h"

#include <cstdlib>
#include <mutex>

namespace lathe::jobs {
namespace job_api_detail {

std::mutex g_mu;
std::optional<JobApi> g_server;  // guarded by g_mu

}  // namespace job_api_detail

void set_server_job_api(const std::string& host, int port, const std::string& key) {
  std::string h = host;
  if (h.empty() || h == "0.0.0.0" || h == "localhost") h = "127.0.0.1";
  if (h == "::" || h == "[::]") h = "::1";
  if (h.find(':') != std::string::npos && h.front() != '[') h = "[" + h + "]";
  std::lock_guard<std::mutex> lock(job_api_detail::g_mu);
  job_api_detail::g_server = JobApi{"http://" + h + ":" + std::to_string(port), key};
}

std::optional<JobApi> job_api() {
  {
    std::lock_guard<std::mutex> lock(job_api_detail::g_mu);
    if (job_api_detail::g_server) return job_api_detail::g_server;
  }
  const char* url = std::getenv(kJobApiUrlEnv);
  if (!url || !*url) return std::nullopt;
  const char* key = std::getenv(kJobApiKeyEnv);
  return JobApi{url, key ? key : ""};
}

std::vector<std::pair<std::string, std::string>> job_api_env() {
  std::lock_guard<std::mutex> lock(job_api_detail::g_mu);
  if (!job_api_detail::g_server) return {};
  return {{kJobApiUrlEnv, job_api_detail::g_server->url}, {kJobApiKeyEnv, job_api_detail::g_server->key}};
}

}  // namespace lathe::jobs
