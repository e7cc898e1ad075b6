#include "jobs/event_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/error.h"
#include "common/os_error.h"

namespace lathe::jobs {
namespace {

// `what path: strerror(errno)`, carrying errno (a full disk is the server's 507).
OsError os_error(const std::string& what, const std::string& path) { return OsError(what + " " + path, errno); }

}  // namespace

void create_log(const std::string& log_path) {
  const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw os_error("cannot create job log", log_path);
  ::close(fd);
}

void append_event(const std::string& log_path, const json& event) {
  const std::string line = event.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw os_error("cannot open job log", log_path);
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;  // nothing written and no error: say so rather than a stale errno
      const OsError err = os_error("cannot append to job log", log_path);
      ::close(fd);
      throw err;
    }
    done += static_cast<size_t>(n);
  }
  ::fdatasync(fd);
  ::close(fd);
}

LogChunk read_events(const std::string& log_path, uint64_t offset, size_t max_bytes) {
  LogChunk chunk;
  chunk.next_offset = offset;
  const int fd = ::open(log_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return chunk;
    throw os_error("cannot read job log", log_path);
  }
  std::string buf(max_bytes, '\0');
  size_t got = 0;
  while (got < buf.size()) {
    const ssize_t n = ::pread(fd, buf.data() + got, buf.size() - got, static_cast<off_t>(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  size_t start = 0;
  while (true) {
    const size_t nl = buf.find('\n', start);
    if (nl == std::string::npos || nl >= got) break;
    const std::string line = buf.substr(start, nl - start);
    if (!line.empty()) {
      try {
        chunk.events.push_back(json::parse(line));
      } catch (const json::exception&) {
        chunk.events.push_back(log_event(line));
      }
    }
    start = nl + 1;
  }
  chunk.next_offset = offset + start;
  return chunk;
}

}  // namespace lathe::jobs
