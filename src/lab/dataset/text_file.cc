#include "lab/dataset/text_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace lathe::dataset {

std::string read_text_file(const std::string& path, const std::string& what) {
  auto fail = [&](const std::string& why) { return Error(ErrorKind::InvalidArgument, what + ": " + path + " " + why); };
  if (path.empty()) throw Error(ErrorKind::InvalidArgument, what + ": empty path");
  // Opened without blocking, so a FIFO with no writer cannot hang the check; only regular files are read.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw fail(std::string("cannot be read (") + std::strerror(errno) + ")");
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) throw fail("is not a regular file");
  if (static_cast<uint64_t>(st.st_size) > kMaxTextFileBytes) throw fail("is larger than 64 MiB");
  std::string text;
  char buf[1 << 16];
  for (;;) {  // bounded by the cap, not by st_size: /proc files report 0 and still hold bytes
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw fail(std::string("cannot be read (") + std::strerror(errno) + ")");
    }
    if (n == 0) break;
    if (text.size() + static_cast<size_t>(n) > kMaxTextFileBytes) throw fail("is larger than 64 MiB");
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

}  // namespace lathe::dataset
