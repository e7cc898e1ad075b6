#include "cache/kv_file_reader.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cache/content_hash.h"
#include "common/error.h"
#include "common/os_error.h"

namespace lathe {
namespace {

// One pread() at most this large: big enough for the kernel to keep the disk's queue full, small enough that a
// reader told to stop stops soon.
constexpr size_t kKvReadChunk = size_t{8} << 20;
constexpr size_t kKvBufferAlign = 4096;

bool kv_rows_kind(const std::string& kind) { return kind == "kv" || kind == "qkv"; }

uint64_t kv_round_up(uint64_t n) { return (n + kKvBufferAlign - 1) / kKvBufferAlign * kKvBufferAlign; }

// The bytes of tensor t of cache e to read: its first `rows` rows, or all of it.
uint64_t kv_read_bytes(const KvCacheEntry& e, const KvTensorSlot& t, int64_t rows, bool whole) {
  if (whole || !kv_rows_kind(e.kind) || t.shape.empty() || t.shape[0] <= 0) return t.bytes;
  return t.bytes / static_cast<uint64_t>(t.shape[0]) * static_cast<uint64_t>(std::min(rows, t.shape[0]));
}

}  // namespace

KvFileReader::KvFileReader(int fd, const KvFileHeader& h, int64_t rows, bool verify)
    : fd_(fd), h_(h), rows_(rows), verify_(verify) {
  if (rows < 1 || rows > static_cast<int64_t>(h.tokens.size()))
    throw Error(ErrorKind::InvalidArgument, "KV file: cannot read " + std::to_string(rows) + " of its " +
                                                std::to_string(h.tokens.size()) + " tokens");
  helper_ = std::thread([this] { run(); });
}

KvFileReader::~KvFileReader() {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  helper_.join();
}

uint64_t KvFileReader::bytes_read() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

const std::vector<Tensor>& KvFileReader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  LATHE_CHECK(returned_ < h_.caches.size(), "KvFileReader::next past the last cache");
  consumed_ = returned_;  // the caller is done with the cache it had: its slot may be refilled
  cv_.notify_all();
  cv_.wait(lock, [&] { return produced_ > returned_ || error_ != nullptr; });
  if (produced_ <= returned_) std::rethrow_exception(error_);
  return slots_[returned_++ % 2].tensors;
}

void KvFileReader::run() {
  try {
    for (size_t i = 0; i < h_.caches.size(); ++i) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || i < consumed_ + 2; });
        if (stop_) return;
      }
      fill(i, slots_[i % 2]);
      {
        const std::lock_guard<std::mutex> lock(mu_);
        produced_ = i + 1;
      }
      cv_.notify_all();
    }
  } catch (...) {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
    }
    cv_.notify_all();
  }
}

void KvFileReader::fill(size_t i, Slot& slot) {
  const KvCacheEntry& e = h_.caches[i];
  uint64_t need = 0;
  for (const KvTensorSlot& t : e.tensors) need += kv_round_up(kv_read_bytes(e, t, rows_, verify_));
  if (need > slot.capacity) {
    slot.tensors.clear();
    slot.buf.reset();
    void* p = nullptr;
    if (posix_memalign(&p, kKvBufferAlign, static_cast<size_t>(need)) != 0)
      throw Error(ErrorKind::Io, "KV file: cannot allocate a " + std::to_string(need) + "-byte read buffer");
    slot.buf = std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [](uint8_t* q) { std::free(q); });
    slot.capacity = static_cast<size_t>(need);
  }
  slot.tensors.clear();
  uint8_t* at = slot.buf.get();
  for (size_t t = 0; t < e.tensors.size(); ++t) {
    const KvTensorSlot& s = e.tensors[t];
    const uint64_t n = kv_read_bytes(e, s, rows_, verify_);
    uint64_t done = 0;
    while (done < n) {
      {
        const std::lock_guard<std::mutex> lock(mu_);
        if (stop_) throw Error(ErrorKind::Internal, "KV file read stopped");
      }
      const size_t want = static_cast<size_t>(std::min<uint64_t>(n - done, kKvReadChunk));
      const ssize_t r = ::pread(fd_, at + done, want, static_cast<off_t>(h_.data_start + s.off + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw OsError("KV file: read failed", errno);
      if (r == 0) throw Error(ErrorKind::Corrupt, "KV file: the file ends inside caches[" + std::to_string(i) + "]");
      done += static_cast<uint64_t>(r);
      const std::lock_guard<std::mutex> lock(mu_);
      bytes_ += static_cast<uint64_t>(r);
    }
    if (verify_ && hash64(at, static_cast<size_t>(n)) != s.hash)
      throw Error(ErrorKind::Corrupt, "caches[" + std::to_string(i) + "].tensors[" + std::to_string(t) +
                                          "]: tensor hash mismatch (the data is corrupt)");
    Shape shape = s.shape;  // what was read: the whole tensor, or its first rows
    if (n < s.bytes) shape[0] = static_cast<int64_t>(n / (s.bytes / static_cast<uint64_t>(s.shape[0])));
    Tensor x = Tensor::alias(at, shape, s.dtype, slot.buf);
    if (kv_rows_kind(e.kind) && rows_ < shape[0]) x = x.slice(0, 0, rows_);  // verified whole, restored in part
    slot.tensors.push_back(std::move(x));
    at += kv_round_up(n);
  }
}

}  // namespace lathe
