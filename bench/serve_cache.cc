// The prompt cache through `lathe serve`, as a client sees it: per prefix length T, the time to the first
// token (a non-streamed /v1/completions with max_tokens 1, token-id prompts) for
//   cold     — T random tokens on a fresh server (prefill),
//   RAM hit  — T + 8 tokens extending it (the kept cache in RAM),
//   SSD hit  — after the server is stopped (its kept caches flushed to --ssd-cache) and started again,
//              T + 16 tokens extending it (a KV file restored),
// plus cached_tokens of each and /v1/cache's restore time and read rate. Prints one JSON line.
// --evict-page-cache drops the stored files' pages from the page cache between the two servers (fadvise, no
// root needed), so the SSD hit reads the medium rather than RAM; --medium-probe-mb N first writes N MB into
// --dir, evicts it the same way and times one sequential read of it: the medium's read rate in the same run.
//
// Usage: serve_cache --lathe build/lathe --model DIR --dir TMP [--tokens 4096] [--evict-page-cache]
//                    [--medium-probe-mb 4096] [--serve-arg ARG ...]
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "serve_harness.h"

namespace {

using bench::Clock;
using bench::seconds;
using nlohmann::json;

// GET on 127.0.0.1:port with Connection: close; returns the body.
std::string http_get(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    throw std::runtime_error("cannot connect");
  }
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    throw std::runtime_error("short write");
  }
  std::string resp;
  char buf[8192];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) resp.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t at = resp.find("\r\n\r\n");
  return at == std::string::npos ? std::string() : resp.substr(at + 4);
}

struct Shot {
  double ttft_ms = 0;
  int cached = 0, prompt = 0;
  json engine;  // /v1/cache's last_request: the engine's attach and prefill times for it
};

Shot complete(int port, const std::vector<int>& ids) {
  const std::string body =
      json{{"model", "m"}, {"prompt", ids}, {"max_tokens", 1}, {"temperature", 0}, {"stream", false}}.dump();
  std::string out;
  const auto t0 = Clock::now();
  bench::http_post(port, "/v1/completions", body, [&](const char* p, size_t n) { out.append(p, n); });
  Shot s;
  s.ttft_ms = seconds(t0, Clock::now()) * 1e3;
  const json j = json::parse(out);
  s.prompt = j.at("usage").at("prompt_tokens").get<int>();
  s.cached = j.at("usage").at("prompt_tokens_details").at("cached_tokens").get<int>();
  return s;
}

// Writes back and drops the page-cache pages of every file under dir: the next read comes from the medium.
int evict_page_cache(const std::string& dir) {
  int files = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const int fd = open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    fdatasync(fd);
    if (posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0) ++files;
    close(fd);
  }
  return files;
}

// The medium's sequential read rate (MB/s): mb MB written to dir/probe, synced, evicted, read once in 8 MiB
// reads, deleted.
double probe_medium_mb_s(const std::string& dir, int mb) {
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/medium-probe.bin";
  std::vector<char> buf(size_t{8} << 20);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<char>(i * 2654435761u >> 13);
  const int64_t total = int64_t{mb} << 20;
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error("cannot write " + path);
  for (int64_t done = 0; done < total;) {
    const ssize_t n = write(fd, buf.data(), static_cast<size_t>(std::min<int64_t>(total - done, buf.size())));
    if (n <= 0) throw std::runtime_error("short write to " + path);
    done += n;
  }
  fsync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
  fd = open(path.c_str(), O_RDONLY);
  const auto t0 = Clock::now();
  int64_t got = 0;
  for (ssize_t n; (n = read(fd, buf.data(), buf.size())) > 0;) got += n;
  const double s = seconds(t0, Clock::now());
  close(fd);
  std::filesystem::remove(path);
  return s > 0 ? static_cast<double>(got) / 1e6 / s : 0;
}

json shot_json(const Shot& s) {
  return {{"ttft_ms", s.ttft_ms}, {"cached_tokens", s.cached}, {"prompt", s.prompt}, {"engine", s.engine}};
}

// complete() plus the engine's own split of that request's time (attach vs prefill). The engine publishes its
// cache counters after the step that answered, so /v1/cache is polled (up to 5 s) until they show this request:
// its prefill of the uncached tokens.
Shot complete_timed(int port, const std::vector<int>& ids) {
  Shot s = complete(port, ids);
  for (int i = 0; i < 100; ++i) {
    try {
      s.engine = json::parse(http_get(port, "/v1/cache")).value("last_request", json());
      if (s.engine.is_object() && s.engine.value("prefill_tokens", -1) == s.prompt - s.cached) break;
    } catch (const std::exception&) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"TTFT cold vs RAM hit vs SSD hit after a restart, through lathe serve"};
  std::string lathe = "build/lathe", model, dir;
  std::vector<int> sizes = {4096};
  std::vector<std::string> serve_args;
  bool evict = false;
  int probe_mb = 0;
  app.add_option("--lathe", lathe, "the lathe binary");
  app.add_option("--model", model, "checkpoint directory")->required();
  app.add_option("--dir", dir, "the --ssd-cache directory (emptied first)")->required();
  app.add_option("--tokens", sizes, "prefix lengths")->delimiter(',');
  app.add_flag("--evict-page-cache", evict, "drop the KV files from the page cache before the SSD hit");
  app.add_option("--medium-probe-mb", probe_mb, "time a sequential read of this many MB of --dir's medium");
  app.add_option("--serve-arg", serve_args, "extra lathe serve argument (repeatable)")->allow_extra_args(false);
  CLI11_PARSE(app, argc, argv);
  try {
    std::filesystem::remove_all(dir);
    const double medium_mb_s = probe_mb > 0 ? probe_medium_mb_s(dir, probe_mb) : 0;
    if (probe_mb > 0) std::fprintf(stderr, "medium read %.0f MB/s (%d MB)\n", medium_mb_s, probe_mb);
    std::vector<std::string> args = {"--port", "0", "--model", model, "--ssd-cache", dir, "--accept-any-model"};
    args.insert(args.end(), serve_args.begin(), serve_args.end());
    json runs = json::array();
    for (int t : sizes) {
      std::vector<int> ids;
      for (int k = 0; k < t; ++k) ids.push_back(5 + (k * 7919 + t) % 3000);
      auto extended = [&](int extra) {
        std::vector<int> v = ids;
        for (int k = 0; k < extra; ++k) v.push_back(11 + k);
        return v;
      };
      Shot cold, ram, ssd;
      {
        bench::ServerProcess server(lathe, args);
        const int port = server.wait_ready(300).first;
        cold = complete_timed(port, ids);
        ram = complete_timed(port, extended(8));
        // Wait until the write-behind has stored the conversation (the stop's flush would do it too, but the
        // harness kills a server that takes more than 5 s to stop).
        for (int i = 0; i < 6000; ++i) {
          const json c = json::parse(http_get(port, "/v1/cache"));
          if (c.at("ssd").at("spills").get<int>() >= 1 && c.at("ssd").at("entries").get<int>() >= 1) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
      }
      const int evicted = evict ? evict_page_cache(dir) : 0;
      json info;
      {
        bench::ServerProcess server(lathe, args);
        const int port = server.wait_ready(300).first;
        ssd = complete_timed(port, extended(16));
        info = json::parse(http_get(port, "/v1/cache")).at("ssd");
      }
      runs.push_back({{"tokens", t},
                      {"cold", shot_json(cold)},
                      {"ram_hit", shot_json(ram)},
                      {"ssd_hit", shot_json(ssd)},
                      {"ram_speedup", ram.ttft_ms > 0 ? cold.ttft_ms / ram.ttft_ms : 0},
                      {"ssd_speedup", ssd.ttft_ms > 0 ? cold.ttft_ms / ssd.ttft_ms : 0},
                      {"file_bytes", info.at("bytes")},
                      {"restore_ms", info.at("restore_ms_last")},
                      {"read_mb_s", info.at("read_mb_s_last")},
                      // Where the restore went (reads of the reused rows; waits for the disk vs copies into
                      // the caches), and the cost-aware decision (restored, or recomputed as predicted faster).
                      {"read_bytes", info.value("read_bytes_last", json())},
                      {"restore_wait_ms", info.value("restore_wait_ms_last", json())},
                      {"restore_copy_ms", info.value("restore_copy_ms_last", json())},
                      {"restores_skipped", info.value("skipped", json())},
                      {"decision", info.value("last_decision", json())},
                      {"prefill_tok_s_est", info.value("prefill_tok_s_est", json())},
                      {"restore_mb_s_est", info.value("restore_mb_s_est", json())},
                      {"evicted_files", evicted}});
      std::fprintf(stderr, "%s\n", runs.back().dump().c_str());
    }
    std::printf("%s\n", json{{"bench", "serve_cache"},
                             {"model", model},
                             {"page_cache_evicted", evict},
                             {"medium_read_mb_s", medium_mb_s},
                             {"medium_probe_mb", probe_mb},
                             {"runs", runs}}
                            .dump()
                            .c_str());
    std::filesystem::remove_all(dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "serve_cache: %s\n", e.what());
    return 1;
  }
  return 0;
}
