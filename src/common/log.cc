#include "common/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

#include "common/error.h"

namespace lathe::log {
namespace {
std::atomic<Level> g_level{Level::Info};
std::mutex g_mutex;
const char* level_name(Level l) {
  switch (l) {
    case Level::Debug: return "debug";
    case Level::Info: return "info";
    case Level::Warn: return "warn";
    case Level::Error: return "error";
    case Level::Off: return "off";
  }
  return "?";
}
}  // namespace

void set_level(Level l) { g_level.store(l); }
Level level() { return g_level.load(std::memory_order_relaxed); }

Level parse_level(std::string_view name) {
  for (Level l : {Level::Debug, Level::Info, Level::Warn, Level::Error, Level::Off})
    if (name == level_name(l)) return l;
  throw Error(ErrorKind::InvalidArgument, "unknown log level '" + std::string(name) + "' (debug|info|warn|error|off)");
}

void write(Level l, std::string_view message) {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%H:%M:%S", &tm);
  std::lock_guard lock(g_mutex);
  std::fprintf(stderr, "%s.%03d %-5s %.*s\n", stamp, static_cast<int>(ms), level_name(l),
               static_cast<int>(message.size()), message.data());
}

}  // namespace lathe::log
