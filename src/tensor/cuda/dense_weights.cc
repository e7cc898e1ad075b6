// Dense copies of quantized weights for the multi-row matmul path (tensor/dense_weights.h): a registry keyed by
// the storage of a weight's codes, each entry holding the dequantized rows of that whole storage, so a fused
// weight and its per-module row views read one copy.
#include "tensor/dense_weights.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <utility>

#include "tensor/cuda/kernels.h"
#include "tensor/device_memory.h"
#include "tensor/ops.h"
#include "tensor/ops_cuda_check.h"

namespace lathe {
namespace {

struct Copy {
  std::weak_ptr<Storage> source;  // the codes' storage: expired once the weight is freed
  Tensor dense;                   // every row of that storage, dequantized
};

using Key = std::pair<const Storage*, DType>;

struct Registry {
  std::mutex mu;
  std::atomic<int64_t> budget{0};  // read unlocked on every multi-row linear()
  std::atomic<int64_t> generation{0};
  int64_t held = 0;
  std::map<Key, Copy> copies;
  std::set<Key> refused;

  void drop(std::map<Key, Copy>::iterator it) {
    held -= static_cast<int64_t>(it->second.dense.nbytes());
    copies.erase(it);
  }
  void sweep() {  // copies whose weight is gone
    for (auto it = copies.begin(); it != copies.end();) {
      auto next = std::next(it);
      if (it->second.source.expired()) drop(it);
      it = next;
    }
  }
  void clear() {
    if (!copies.empty()) generation.fetch_add(1, std::memory_order_relaxed);
    copies.clear();
    refused.clear();
    held = 0;
  }
};

// Never destroyed: its device blocks must not be freed after the CUDA runtime has shut down at exit.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

// Where a row view sits in its storage, when the storage is exactly whole rows of the same width: the first
// row and the storage's row count.
struct RowPlace {
  int64_t row0 = 0, rows = 0;
};
std::optional<RowPlace> row_place(const Tensor& t) {
  if (t.ndim() != 2 || t.stride(1) != 1 || t.stride(0) != t.dim(1) || t.dim(1) == 0) return std::nullopt;
  const Storage& s = *t.storage();
  const size_t row_bytes = static_cast<size_t>(t.dim(1)) * dtype_size(t.dtype());
  const size_t offset = static_cast<size_t>(static_cast<const char*>(t.raw()) - static_cast<const char*>(s.data));
  if (s.bytes % row_bytes != 0 || offset % row_bytes != 0) return std::nullopt;
  return RowPlace{static_cast<int64_t>(offset / row_bytes), static_cast<int64_t>(s.bytes / row_bytes)};
}

Tensor whole(const Tensor& t, int64_t rows) {
  const std::shared_ptr<Storage>& s = t.storage();
  return Tensor::alias(s->data, {rows, t.dim(1)}, t.dtype(), s, Device::CUDA);
}

}  // namespace

void set_dense_weight_budget(int64_t bytes) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.budget = std::max<int64_t>(0, bytes);
  r.refused.clear();  // may fit now
  if (r.held > r.budget) r.clear();
}

DenseWeightStats dense_weight_stats() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.sweep();
  return {r.budget.load(), r.held, static_cast<int64_t>(r.copies.size()), static_cast<int64_t>(r.refused.size())};
}

void release_dense_weights() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.clear();
}

int64_t dense_weights_generation() { return registry().generation.load(std::memory_order_relaxed); }

int64_t device_free_bytes() {
  if (!cuda_available()) return 0;
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  const DeviceMemoryStats m = device_memory_stats();
  return static_cast<int64_t>(free + (m.reserved_bytes - std::min(m.reserved_bytes, m.in_use_bytes)));
}

namespace gpu {

const void* dense_weight(const QuantizedMatrix& q, DType t) {
  Registry& r = registry();
  if (r.budget.load(std::memory_order_relaxed) == 0) return nullptr;
  if (!q.w.defined() || q.w.device() != Device::CUDA) return nullptr;
  const auto pw = row_place(q.w), ps = row_place(q.scales), pb = row_place(q.biases);
  // Scales and biases must be row views of whole-row storages aligned with the codes (as loading makes them).
  if (!pw || !ps || !pb || ps->row0 != pw->row0 || pb->row0 != pw->row0 || ps->rows != pw->rows || pb->rows != pw->rows)
    return nullptr;
  const int64_t cols = q.cols();
  const size_t row_offset = static_cast<size_t>(pw->row0 * cols) * dtype_size(t);
  const Key key{q.w.storage().get(), t};
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.copies.find(key);
  if (it != r.copies.end()) {
    if (!it->second.source.expired()) return static_cast<const char*>(it->second.dense.raw()) + row_offset;
    r.drop(it);  // a freed weight whose storage address came back
  }
  if (cuda::capturing()) return nullptr;  // a captured graph must not allocate
  const int64_t need = pw->rows * cols * static_cast<int64_t>(dtype_size(t));
  if (r.held + need > r.budget) r.sweep();
  if (r.held + need > r.budget) {
    r.refused.insert(key);
    return nullptr;
  }
  QuantizedMatrix full;
  full.w = whole(q.w, pw->rows);
  full.scales = whole(q.scales, pw->rows);
  full.biases = whole(q.biases, pw->rows);
  full.bits = q.bits;
  full.group_size = q.group_size;
  Copy c;
  try {
    c.dense = Tensor::empty({pw->rows, cols}, t, Device::CUDA);
  } catch (const std::exception&) {  // out of device memory: the scratch path still works
    r.refused.insert(key);
    return nullptr;
  }
  cuda::dequantize(view(full), 0, pw->rows, c.dense.raw(), t);  // the kernel the scratch path calls
  c.source = q.w.storage();
  r.held += need;
  r.refused.erase(key);
  const void* base = c.dense.raw();
  r.copies.emplace(key, std::move(c));
  return static_cast<const char*>(base) + row_offset;
}

}  // namespace gpu
}  // namespace lathe
