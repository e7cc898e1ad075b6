// Reads the tensors of a KV file's caches into host memory with large pread()s, one cache ahead of the caller
// on a helper thread: the disk reads cache i + 1 while the caller copies cache i into its layer cache.
//
// Why not a mapping of the file: faulting a mapped file in page by page ran at 40–160 MB/s on a 2.8 GB/s disk
// once the file had left the page cache (each fault of a sequentially advised mapping scans the whole readahead
// window in the page cache: kernel time, not I/O), where a read() of the same bytes ran at the disk's rate.
// Two buffers of the largest cache's bytes are all the memory it adds.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cache/kv_file.h"

namespace lathe {

class KvFileReader {
 public:
  // fd: the open file h was parsed from (borrowed; must outlive the reader). rows: the tokens to read of each kv
  // and qkv cache (a prefix of its rows, 1..h.tokens.size()); rotating and ssm caches are always read whole.
  // verify: read every tensor whole and check its hash (Error(Corrupt) naming the tensor on a mismatch).
  KvFileReader(int fd, const KvFileHeader& h, int64_t rows, bool verify);
  ~KvFileReader();  // stops the helper (mid-file when the caller gave up) and joins it
  KvFileReader(const KvFileReader&) = delete;
  KvFileReader& operator=(const KvFileReader&) = delete;

  // Cache i's tensors on the host, in the file's order (call for i = 0, 1, ... once each), shaped as restored:
  // kv/qkv tensors hold `rows` rows. Valid until the next call. Rethrows whatever the reading threw.
  const std::vector<Tensor>& next();
  // Bytes read from the file so far (for rates).
  uint64_t bytes_read() const;

 private:
  struct Slot {
    std::shared_ptr<uint8_t> buf;
    size_t capacity = 0;
    std::vector<Tensor> tensors;
  };
  void run();                  // the helper thread
  void fill(size_t i, Slot&);  // reads cache i into a slot

  int fd_;
  const KvFileHeader& h_;
  int64_t rows_;
  bool verify_;
  Slot slots_[2];

  mutable std::mutex mu_;
  std::condition_variable cv_;
  size_t produced_ = 0;  // caches ready (slots_[i % 2] holds cache i while i < produced_)
  size_t consumed_ = 0;  // caches the caller is done with (their slots may be refilled)
  size_t returned_ = 0;  // caches handed out by next()
  uint64_t bytes_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread helper_;
};

}  // namespace lathe
