// One logger with levels, writing to stderr. Cheap when a level is off.
#pragma once
#include <string>
#include <string_view>

namespace lathe::log {

enum class Level { Debug = 0, Info = 1, Warn = 2, Error = 3, Off = 4 };

void set_level(Level level);
Level level();
Level parse_level(std::string_view name);  // debug|info|warn|error|off; throws on anything else
void write(Level level, std::string_view message);

inline void debug(std::string_view m) {
  if (level() <= Level::Debug) write(Level::Debug, m);
}
inline void info(std::string_view m) {
  if (level() <= Level::Info) write(Level::Info, m);
}
inline void warn(std::string_view m) {
  if (level() <= Level::Warn) write(Level::Warn, m);
}
inline void error(std::string_view m) {
  if (level() <= Level::Error) write(Level::Error, m);
}

}  // namespace lathe::log
