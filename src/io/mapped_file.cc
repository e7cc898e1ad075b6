#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <vector>

#include "common/error.h"
#include "common/limits.h"
#include "common/os_error.h"
#include "io/atomic_file.h"

namespace lathe {

namespace {

// Opens a regular file for reading, or throws naming it. O_NONBLOCK: opening a FIFO (or a device) must not
// wait for a writer; such a path is refused right after, by its type. Returns the descriptor and its stat.
int open_regular(const std::string& path, struct stat& st) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) throw Error(ErrorKind::NotFound, path + ": " + std::strerror(errno));
    throw OsError(path, errno);
  }
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    throw OsError(path, e);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(ErrorKind::Io, path + ": not a regular file (lathe reads model files only from regular files)");
  }
  return fd;
}

// The live mappings, for drop_pages. Never destroyed: a mapping held by a static (a test's model cache) is
// unmapped during exit, after function-local statics would be gone.
std::mutex& maps_mu() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::vector<const MappedFile*>& live_maps() {
  static auto* maps = new std::vector<const MappedFile*>;
  return *maps;
}

}  // namespace

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
  struct stat st {};
  int fd = open_regular(path, st);
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      throw OsError(path + ": mmap failed", e);
    }
    f->data_ = p;
  }
  ::close(fd);
  if (f->data_) {
    std::lock_guard lock(maps_mu());
    live_maps().push_back(f.get());
  }
  return f;
}

MappedFile::~MappedFile() {
  if (!data_) return;
  {
    std::lock_guard lock(maps_mu());
    auto& maps = live_maps();
    maps.erase(std::remove(maps.begin(), maps.end(), this), maps.end());
  }
  ::munmap(data_, size_);
}

void MappedFile::drop_pages(const void* p, size_t n) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), e = a + n;
  std::lock_guard lock(maps_mu());
  for (const MappedFile* m : live_maps()) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(m->data_);
    if (a < base || e > base + m->size_) continue;
    const uintptr_t from = (a + page - 1) / page * page, to = e / page * page;  // whole pages inside the range
    if (to > from) ::madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED);
    return;
  }
}

std::string read_text_file(const std::string& path) {
  struct stat st {};
  int fd = open_regular(path, st);
  if (static_cast<uint64_t>(st.st_size) > limits::kJsonFileMaxBytes) {
    ::close(fd);
    throw Error(ErrorKind::Corrupt, path + ": " + std::to_string(st.st_size) + " bytes is larger than the " +
                                        std::to_string(limits::kJsonFileMaxBytes) + " bytes a text file may have");
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) break;  // shrank while being read: what is there
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      throw OsError(path, e);
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

void write_file_atomic(const std::string& path, const void* data, size_t size) {
  AtomicFile file(path);
  file.write(data, size);
  file.commit();
}

}  // namespace lathe
