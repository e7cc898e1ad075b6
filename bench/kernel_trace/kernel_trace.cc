// A GPU kernel tracer for the device machine, which has no Nsight: LD_PRELOAD=kernel_trace.so
// LATHE_KTRACE_OUT=FILE prog ... records every kernel and copy through CUPTI's activity API and writes, at exit,
// one JSON object: per kernel name its launches, total and mean GPU time, and the window's wall span and busy
// time (the union of the kernels' intervals). A program may bracket the part it wants traced by calling the weak
// symbol lathe_ktrace_window(1) / (0) (bench/cuda_e2e does around its queued batched steps); without a window
// every kernel counts.
#include <cupti.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Span {
  uint64_t start, end;
  std::string name;
};

std::mutex g_mu;
// Never destroyed: report() runs from atexit, possibly after this file's static destructors.
std::vector<Span>& g_spans = *new std::vector<Span>;
uint64_t g_open = 0, g_close = UINT64_MAX;  // the window, in CUPTI's clock
bool g_windowed = false;

void CUPTIAPI on_request(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = 8 << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI on_complete(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::lock_guard lock(g_mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      g_spans.push_back({k->start, k->end, k->name ? k->name : "?"});
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
      g_spans.push_back({m->start, m->end, "memcpy kind " + std::to_string(m->copyKind)});
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
      g_spans.push_back({m->start, m->end, "memset"});
    }
  }
  std::free(buffer);
}

void json_string(FILE* f, const std::string& s) {
  std::fputc('"', f);
  for (char c : s) {
    if (c == '"' || c == '\\') std::fputc('\\', f);
    if (static_cast<unsigned char>(c) >= 0x20) std::fputc(c, f);
  }
  std::fputc('"', f);
}

void report() {
  cuptiActivityFlushAll(1);
  const char* path = std::getenv("LATHE_KTRACE_OUT");
  FILE* f = path ? std::fopen(path, "w") : stderr;
  if (!f) return;
  std::lock_guard lock(g_mu);
  std::vector<Span> in;
  for (const Span& s : g_spans)
    if (!g_windowed || (s.start >= g_open && s.start < g_close)) in.push_back(s);
  std::sort(in.begin(), in.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
  uint64_t busy = 0, reach = 0;
  for (const Span& s : in) {  // the union of the intervals: time the GPU ran at least one of them
    const uint64_t from = std::max(s.start, reach);
    if (s.end > from) busy += s.end - from;
    reach = std::max(reach, s.end);
  }
  struct Sum {
    uint64_t n = 0, ns = 0;
  };
  std::map<std::string, Sum> by;
  for (const Span& s : in) {
    Sum& x = by[s.name];
    ++x.n;
    x.ns += s.end - s.start;
  }
  std::vector<std::pair<std::string, Sum>> rows(by.begin(), by.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  const uint64_t span = in.empty() ? 0 : reach - in.front().start;
  std::fprintf(f, "{\"windowed\":%s,\"records\":%zu,\"span_ms\":%.4f,\"busy_ms\":%.4f,\"kernels\":[",
               g_windowed ? "true" : "false", in.size(), span / 1e6, busy / 1e6);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::fprintf(f, "%s\n{\"name\":", i ? "," : "");
    json_string(f, rows[i].first);
    std::fprintf(f, ",\"count\":%llu,\"total_ms\":%.4f,\"mean_us\":%.3f}",
                 static_cast<unsigned long long>(rows[i].second.n), rows[i].second.ns / 1e6,
                 rows[i].second.ns / 1e3 / static_cast<double>(rows[i].second.n));
  }
  std::fprintf(f, "]}\n");
  if (f != stderr) std::fclose(f);
}

__attribute__((constructor)) void start() {
  cuptiActivityRegisterCallbacks(on_request, on_complete);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
  std::atexit(report);
}

}  // namespace

extern "C" void lathe_ktrace_window(int on) {
  uint64_t now = 0;
  cuptiGetTimestamp(&now);
  std::lock_guard lock(g_mu);
  g_windowed = true;
  if (on)
    g_open = now, g_close = UINT64_MAX;
  else
    g_close = now;
}
