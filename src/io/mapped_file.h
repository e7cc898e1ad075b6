// A read-only memory mapping of a whole file. Tensors alias its pages; the mapping lives as long as any of them.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

namespace lathe {

class MappedFile {
 public:
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const unsigned char* data() const { return static_cast<const unsigned char*>(data_); }
  size_t size() const { return size_; }

  // Bytes [p, p + n) will not be read for a while (weights repacked at load): when they lie in a live mapping,
  // its whole pages inside the range leave this process's resident set (the file's pages, clean and read-only,
  // come back from the page cache or the disk if read again). Anything else — heap memory, a range a mapping
  // does not hold — is left alone.
  static void drop_pages(const void* p, size_t n);

 private:
  MappedFile() = default;
  std::string path_;
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Reads a whole (small) text file; throws Error(NotFound/Io) naming the path.
std::string read_text_file(const std::string& path);
// Writes bytes to path atomically (io/atomic_file.h: path.tmp, fsync, rename, directory fsync). A crash never
// leaves a half-written file at `path`.
void write_file_atomic(const std::string& path, const void* data, size_t size);

}  // namespace lathe
