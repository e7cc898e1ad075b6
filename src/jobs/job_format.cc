#include "jobs/job_format.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace lathe::jobs {

// Built with append (not operator+ chains, which trip GCC 12's -Wrestrict false positive).
std::string format_event(const json& e) {
  const std::string type = e.value("type", "?");
  std::string s;
  if (type == "log") return e.value("line", "");
  if (type == "started") return "[started]";
  if (type == "done") {
    s.append("[done]");
    if (e.contains("output_dir") && e["output_dir"].is_string())
      s.append(" ").append(e["output_dir"].get<std::string>());
    if (e.contains("summary")) s.append(" ").append(e["summary"].dump());
    return s;
  }
  if (type == "failed") {
    s.append("[").append(e.value("status", std::string("failed"))).append("] ").append(e.value("error", ""));
    return s;
  }
  if (type == "stage" || type == "metric") {
    s.append("[");
    if (type == "stage") {
      s.append(e.value("stage", ""));
    } else {
      s.append(e.value("kind", "")).append(" step ").append(std::to_string(e.value("step", 0)));
    }
    if (e.contains("progress") && e["progress"].is_number())
      s.append(" ")
          .append(std::to_string(static_cast<int>(std::lround(e["progress"].get<double>() * 100))))
          .append("%");
    s.append("]");
    if (e.contains("loss") && e["loss"].is_number()) s.append(" loss ").append(std::to_string(e["loss"].get<double>()));
    if (e.contains("message") && e["message"].is_string()) s.append(" ").append(e["message"].get<std::string>());
    return s;
  }
  return e.dump();
}

Emit terminal_emit(bool is_terminal) {
  return [is_terminal](const json& e) noexcept {
    try {
      const std::string type = e.value("type", "");
      if (is_terminal && type == "stage" && e.contains("progress") && e["progress"].is_number()) {
        const double p = std::clamp(e["progress"].get<double>(), 0.0, 1.0);
        const int width = 30, filled = static_cast<int>(p * width);
        std::string bar(static_cast<size_t>(filled), '#');
        bar.resize(width, '.');
        std::string msg = e.value("stage", "") + " " + e.value("message", "");
        if (msg.size() > 60) msg.resize(60);
        std::fprintf(stderr, "\r[%s] %3d%% %-60s", bar.c_str(), static_cast<int>(p * 100), msg.c_str());
        std::fflush(stderr);
        return;
      }
      if (is_terminal) std::fprintf(stderr, "\r%-100s\r", "");
      std::fprintf(stderr, "%s\n", format_event(e).c_str());
    } catch (...) {
    }
  };
}

}  // namespace lathe::jobs
