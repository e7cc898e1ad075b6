// Device, stream, cuBLAS handle and the caching allocator behind tensor/device_memory.h.
// The allocator keeps freed blocks in exact-size bins (sizes rounded up) and hands them out again, so a
// decode step that asks for the same shapes as the one before calls cudaMalloc zero times. Blocks of a new size
// from 512 KiB to 16 MiB are carved from 128 MiB segments: a wave of them (every row's K/V growing at once: 72
// buffers a row on a 36-layer model) costs one cudaMalloc a segment, not one a block.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/env.h"
#include "common/error.h"
#include "common/os_error.h"
#include "tensor/cuda/allocator.h"
#include "tensor/cuda/cublas_api.h"
#include "tensor/cuda/runtime.h"
#include "tensor/device_memory.h"

namespace lathe {
namespace cuda {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(ErrorKind::Internal, std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(ErrorKind::Internal,
                std::string("cuBLAS error ") + std::to_string(static_cast<int>(s)) + " in " + what);
}

void check_alloc(cudaError_t e, const char* memory, size_t bytes, const char* what) {
  if (e == cudaSuccess) return;
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: clear it so that the next check does not report it again
    throw OsError(ENOMEM, std::string("out of ") + memory + " memory allocating " + std::to_string(bytes) + " bytes (" +
                              what + ")");
  }
  check(e, what);
}

void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

namespace {

class CachingAllocator;
CachingAllocator& allocator();
void* allocator_alloc(size_t bytes);

struct Runtime {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  int sms = 0;
  void* blas_workspace = nullptr;
  Runtime() {
    LATHE_CUDA_CHECK(cudaSetDevice(0));
    cudaDeviceProp prop{};
    LATHE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    sms = prop.multiProcessorCount;
    LATHE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const CublasApi& api = cublas_api();
    check(api.create(&blas), "cublasCreate");
    check(api.set_stream(blas, stream), "cublasSetStream");
    // Our own workspace, so cuBLAS allocates nothing behind the allocator's back (and graphs can capture it).
    constexpr size_t kWorkspace = 32u << 20;
    blas_workspace = allocator_alloc(kWorkspace);
    check(api.set_workspace(blas, blas_workspace, kWorkspace), "cublasSetWorkspace");
  }
};

Runtime& rt() {
  static Runtime* r = new Runtime();  // never destroyed: kernels may still reference it at exit
  return *r;
}

class CachingAllocator {
 public:
  void* alloc(size_t bytes) {
    size_t size = round(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    auto& bin = free_[size];
    void* p = nullptr;
    if (auto reused = reuse_capture_ ? captured_free_.find(size) : captured_free_.end();
        reused != captured_free_.end() && !reused->second.empty()) {
      p = reused->second.back();  // still listed in captured_: the graph keeps it
      reused->second.pop_back();
    } else if (!bin.empty()) {
      p = bin.back();
      bin.pop_back();
      cached_ -= size;
      count_held(p, +1);
    } else if ((p = carve(size)) != nullptr) {
    } else {
      cudaError_t e = cudaMalloc(&p, size);
      if (e == cudaErrorMemoryAllocation) {  // give the cached blocks back and try once more
        cudaGetLastError();
        release_cached_locked();
        e = cudaMalloc(&p, size);
      }
      if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        // Carved blocks stay cached while their segment is in use: a larger one serves before giving up.
        p = take_larger_locked(size);
        if (!p)  // ENOMEM: the server's 503 insufficient_memory (server/api_error.h)
          throw OsError(ENOMEM, "out of device memory allocating " + std::to_string(bytes) + " bytes (" +
                                    std::to_string(stats_.reserved_bytes >> 20) + " MiB reserved)");
      } else if (e != cudaSuccess) {  // not a lack of memory (a sticky fault of an earlier kernel, say): as it is
        cudaGetLastError();
        throw Error(ErrorKind::Internal,
                    "CUDA error in cudaMalloc of " + std::to_string(bytes) + " bytes: " + cudaGetErrorString(e));
      } else {
        ++stats_.malloc_calls;
        stats_.reserved_bytes += size;
        if (stats_.reserved_bytes > stats_.peak_reserved_bytes) stats_.peak_reserved_bytes = stats_.reserved_bytes;
      }
    }
    live_[p] = size;
    stats_.in_use_bytes += size;
    if (stats_.in_use_bytes > stats_.peak_in_use_bytes) stats_.peak_in_use_bytes = stats_.in_use_bytes;
    ++stats_.alloc_requests;
    return p;
  }

  void free(void* p) {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) return;
    const size_t size = it->second;
    live_.erase(it);
    stats_.in_use_bytes -= size;
    if (capturing_) {  // a graph being captured may write this block on every replay
      if (!reused_.count(p)) captured_.push_back({p, size});
      if (reuse_capture_) {
        captured_free_[size].push_back(p);
        reused_.insert(p);
      }
      return;
    }
    // Stream order makes reuse safe: later kernels on the one stream run after earlier users of the block.
    free_[size].push_back(p);
    cached_ += size;
    count_held(p, -1);
  }

  void capture_begin(bool reuse) {
    std::lock_guard<std::mutex> lock(mu_);
    capturing_ = true;
    reuse_capture_ = reuse;
  }
  std::vector<Block> capture_end() {
    std::lock_guard<std::mutex> lock(mu_);
    capturing_ = false;
    reuse_capture_ = false;
    // A block freed, taken again and still live at the end belongs to its holder, not to the graph's pool.
    std::vector<Block> pool;
    for (const Block& b : captured_)
      if (!live_.count(b.ptr)) pool.push_back(b);
    captured_.clear();
    captured_free_.clear();
    reused_.clear();
    return pool;
  }
  void release(const std::vector<Block>& blocks) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Block& b : blocks) {
      free_[b.size].push_back(b.ptr);
      cached_ += b.size;
      count_held(b.ptr, -1);
    }
  }

  DeviceMemoryStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  void release_cached() {
    std::lock_guard<std::mutex> lock(mu_);
    release_cached_locked();
  }

  void reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_in_use_bytes = stats_.in_use_bytes;
    stats_.peak_reserved_bytes = stats_.reserved_bytes;
  }

  static size_t round(size_t b) {
    if (b == 0) b = 1;
    if (b < (1u << 20)) return (b + 511) / 512 * 512;
    return (b + (2u << 20) - 1) / (2u << 20) * (2u << 20);
  }

 private:
  static constexpr size_t kCarveMin = size_t{512} << 10, kCarveMax = size_t{16} << 20;
  static constexpr size_t kSegmentBytes = size_t{128} << 20;
  struct Segment {
    size_t size = 0, used = 0;
    int64_t held = 0;  // carved blocks not in a free bin (live, or kept by a captured graph)
  };

  // A carved block leaving (+1) or entering (-1) a free bin; blocks of their own are not counted.
  void count_held(void* p, int64_t delta) {
    if (auto c = carved_.find(p); c != carved_.end()) segments_[c->second].held += delta;
  }

  // A block of `size` from the segment being carved (a new segment when it is full), or null where the size
  // is not carved or no segment can be had (the caller's cudaMalloc then frees what it can and tries once).
  void* carve(size_t size) {
    if (size < kCarveMin || size > kCarveMax || !carving_) return nullptr;
    if (!tail_ || segments_[tail_].size - segments_[tail_].used < size) {
      void* base = nullptr;
      if (cudaMalloc(&base, kSegmentBytes) != cudaSuccess) {
        cudaGetLastError();
        return nullptr;
      }
      ++stats_.malloc_calls;
      stats_.reserved_bytes += kSegmentBytes;
      if (stats_.reserved_bytes > stats_.peak_reserved_bytes) stats_.peak_reserved_bytes = stats_.reserved_bytes;
      tail_ = static_cast<char*>(base);
      segments_[tail_].size = kSegmentBytes;
    }
    Segment& seg = segments_[tail_];
    char* p = tail_ + seg.used;
    seg.used += size;
    ++seg.held;
    carved_[p] = tail_;
    return p;
  }

  // The smallest cached block of at least `size` bytes, taken from its bin (size: set to the block's), or null.
  void* take_larger_locked(size_t& size) {
    size_t best = 0;
    for (const auto& [s, bin] : free_)
      if (s >= size && !bin.empty() && (best == 0 || s < best)) best = s;
    if (best == 0) return nullptr;
    auto& bin = free_[best];
    void* p = bin.back();
    bin.pop_back();
    cached_ -= best;
    count_held(p, +1);
    size = best;
    return p;
  }

  void release_cached_locked() {
    cudaStreamSynchronize(rt().stream);
    // Blocks of their own go back to the driver; carved ones only with their whole segment, once every block
    // carved from it is back in a bin.
    for (auto& [size, bin] : free_) {
      std::vector<void*> kept;
      for (void* p : bin) {
        if (carved_.count(p)) {
          kept.push_back(p);
          continue;
        }
        cudaFree(p);
        stats_.reserved_bytes -= size;
      }
      bin.swap(kept);
    }
    std::unordered_set<char*> gone;
    for (auto it = segments_.begin(); it != segments_.end();) {
      if (it->second.held != 0) {
        ++it;
        continue;
      }
      gone.insert(it->first);
      cudaFree(it->first);
      stats_.reserved_bytes -= it->second.size;
      if (tail_ == it->first) tail_ = nullptr;
      it = segments_.erase(it);
    }
    cached_ = 0;
    for (auto& [size, bin] : free_) {
      std::vector<void*> kept;
      for (void* p : bin) {
        auto c = carved_.find(p);
        if (c != carved_.end() && gone.count(c->second)) {
          carved_.erase(c);
          continue;
        }
        kept.push_back(p);
        cached_ += size;
      }
      bin.swap(kept);
    }
  }

  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  std::unordered_map<void*, size_t> live_;
  size_t cached_ = 0;
  bool capturing_ = false;
  bool reuse_capture_ = false;
  std::vector<Block> captured_;
  std::unordered_map<size_t, std::vector<void*>> captured_free_;  // reuse_capture_: freed, free to take again
  std::unordered_set<void*> reused_;                              // blocks already listed in captured_
  // LATHE_CUDA_CARVE=0: every new block its own cudaMalloc (the allocator before segments, for comparisons).
  const bool carving_ = env_switch("LATHE_CUDA_CARVE");
  std::map<char*, Segment> segments_;
  std::unordered_map<void*, char*> carved_;  // carved block -> its segment
  char* tail_ = nullptr;                     // the segment being carved
  DeviceMemoryStats stats_;
};

CachingAllocator& allocator() {
  static CachingAllocator* a = new CachingAllocator();
  return *a;
}
void* allocator_alloc(size_t bytes) { return allocator().alloc(bytes); }

}  // namespace

void allocator_capture_begin(bool reuse) { allocator().capture_begin(reuse); }
std::vector<Block> allocator_capture_end() { return allocator().capture_end(); }
void allocator_release(const std::vector<Block>& blocks) { allocator().release(blocks); }

cudaStream_t stream() { return rt().stream; }
cublasHandle_t cublas() { return rt().blas; }
int sm_count() { return rt().sms; }
// Programmatic dependent launch is a Hopper feature (sm_90+): chosen from the device at run time, so one
// binary built for sm_80..sm_90 uses it where it exists and plain launches elsewhere.
void upload_async(void* dst, const void* src, size_t bytes) {
  // A pinned ring, so the copy is asynchronous and the caller's buffer is free at once. Wrapping waits for the
  // stream (every copy still in flight read from the ring): with the few KiB a batched layer uploads, once in
  // thousands of launches.
  constexpr size_t kRing = size_t{8} << 20;
  static char* ring = [] {
    void* p = nullptr;
    LATHE_CUDA_ALLOC_CHECK(cudaMallocHost(&p, kRing), "pinned host", kRing);
    return static_cast<char*>(p);
  }();
  static size_t head = 0;
  if (bytes == 0) return;
  if (bytes > kRing) {
    device_copy(dst, src, bytes, Device::CUDA, Device::CPU);
    return;
  }
  if (head + bytes > kRing) {
    LATHE_CUDA_CHECK(cudaStreamSynchronize(stream()));
    head = 0;
  }
  char* stage = ring + head;
  head = (head + bytes + 255) / 256 * 256;
  std::memcpy(stage, src, bytes);
  LATHE_CUDA_CHECK(cudaMemcpyAsync(dst, stage, bytes, cudaMemcpyHostToDevice, stream()));
}

void copy_async(void* dst, const void* src, size_t bytes) {
  if (bytes) LATHE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
}

std::recursive_mutex& capture_mutex() {
  static auto* m = new std::recursive_mutex;  // never destroyed: copies may run during exit
  return *m;
}

bool pdl_enabled() {
  static const bool on = [] {
    if (!env_switch("LATHE_CUDA_PDL")) return false;
    int dev = 0, major = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
  }();
  return on;
}

}  // namespace cuda

bool cuda_available() {
  static const bool ok = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return n > 0;
  }();
  return ok;
}

void* device_alloc(size_t bytes) {
  if (!cuda_available()) throw Error(ErrorKind::Unsupported, "--device cuda: no CUDA device is present");
  cuda::rt();
  return cuda::allocator().alloc(bytes);
}

void device_free(void* p) { cuda::allocator().free(p); }

void device_memset_zero(void* p, size_t bytes) {
  const std::lock_guard<std::recursive_mutex> capture(cuda::capture_mutex());  // as device_copy
  LATHE_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, cuda::stream()));
}

void device_copy(void* dst, const void* src, size_t bytes, Device dst_device, Device src_device) {
  if (bytes == 0) return;
  const std::lock_guard<std::recursive_mutex> capture(cuda::capture_mutex());
  cudaStream_t s = cuda::stream();
  if (dst_device == Device::CUDA && src_device == Device::CUDA) {
    LATHE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
    return;
  }
  const cudaMemcpyKind kind = dst_device == Device::CUDA ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  LATHE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, s));
  // The host buffer may be read or freed as soon as we return.
  LATHE_CUDA_CHECK(cudaStreamSynchronize(s));
}

void device_synchronize() {
  if (cuda_available()) LATHE_CUDA_CHECK(cudaStreamSynchronize(cuda::stream()));
}

DeviceMemoryStats device_memory_stats() { return cuda_available() ? cuda::allocator().stats() : DeviceMemoryStats{}; }
size_t device_alloc_size(size_t bytes) { return cuda::CachingAllocator::round(bytes); }
void device_reset_peak() {
  if (cuda_available()) cuda::allocator().reset_peak();
}
void device_release_cached() {
  if (cuda_available()) cuda::allocator().release_cached();
}

}  // namespace lathe
