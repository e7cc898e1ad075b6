// A file written under `<path>.tmp` and renamed over `<path>` once complete, so that a crash never leaves a
// half-written file under the final name (KV files, safetensors, configs, tokenizer images: DESIGN.md).
// Every failure is an OsError carrying its errno (a full disk is the server's 507: server/api_error.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace lathe {

class AtomicFile {
 public:
  // Creates (or truncates) `<path>.tmp`, mode 0644. Throws OsError "<path>.tmp: <strerror>" if it cannot.
  explicit AtomicFile(std::string path);
  // Uncommitted (a failed write, a caller that threw): closes and removes the .tmp; `path` is left as it was.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  const std::string& path() const { return path_; }
  const std::string& tmp_path() const { return tmp_; }

  // Writes all n bytes at `offset` (EINTR and short writes retried). OsError "<tmp>: write failed: ...".
  void write_at(uint64_t offset, const void* data, size_t n);
  // Writes at the end of the previous write() (0 at first); write_at does not move that position.
  void write(const void* data, size_t n);
  uint64_t position() const { return pos_; }

  // Truncates to `size` bytes, fsyncs, closes and renames the .tmp over `path`, then fsyncs the directory so that
  // the rename is durable (best effort: a file system that cannot fsync a directory does not fail the write).
  // OsErrors "<tmp>: truncate failed", "<tmp>: fsync failed", "<tmp>: close failed", "rename <tmp> -> <path>";
  // after any of them the .tmp is gone (at the latest when this object is) and `path` untouched.
  void commit(uint64_t size);
  // commit(position()): for files written only with write().
  void commit() { commit(pos_); }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  uint64_t pos_ = 0;
  bool committed_ = false;
};

}  // namespace lathe
