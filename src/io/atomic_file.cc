#include "io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <utility>

#include "common/error.h"
#include "common/os_error.h"

namespace lathe {
namespace {

// Throws `what: strerror(err)`. Callers save errno right after the call that failed, before building `what`
// (which allocates and may change errno; the order in which arguments are evaluated is unspecified).
[[noreturn]] void atomic_file_fail(int err, const std::string& what) { throw OsError(what, err); }

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int e = errno;
    atomic_file_fail(e, tmp_);  // the wording lathe's writers have always had: "<tmp>: <strerror>"
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFile::write_at(uint64_t offset, const void* data, size_t n) {
  LATHE_CHECK(fd_ >= 0, "AtomicFile: write after commit");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
    const int e = w < 0 ? errno : EIO;  // nothing written and no error: say so rather than a stale errno
    if (w < 0 && e == EINTR) continue;
    if (w <= 0) atomic_file_fail(e, tmp_ + ": write failed");
    p += w;
    offset += static_cast<uint64_t>(w);
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::write(const void* data, size_t n) {
  write_at(pos_, data, n);
  pos_ += n;
}

void AtomicFile::commit(uint64_t size) {
  LATHE_CHECK(fd_ >= 0, "AtomicFile: committed twice");
  if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) {
    const int e = errno;
    atomic_file_fail(e, tmp_ + ": truncate failed");
  }
  if (::fsync(fd_) != 0) {
    const int e = errno;
    atomic_file_fail(e, tmp_ + ": fsync failed");
  }
  const int fd = fd_;
  fd_ = -1;  // closed here whatever close says (a failed close(2) is not retried on Linux)
  if (::close(fd) != 0) {
    const int e = errno;
    atomic_file_fail(e, tmp_ + ": close failed");
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int e = errno;
    atomic_file_fail(e, "rename " + tmp_ + " -> " + path_);
  }
  committed_ = true;
  // The rename is durable only once the directory entry is.
  std::string dir = std::filesystem::path(path_).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace lathe
