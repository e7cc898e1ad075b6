#include "cache/layer_cache.h"
#include "common/error.h"
#include "tensor/ops.h"

namespace lathe {
namespace {

const Tensor& find_tensor(const CacheState& s, const char* name) {
  for (const auto& [n, t] : s.tensors)
    if (n == name) return t;
  throw Error(ErrorKind::Corrupt, std::string("cache state of kind '") + s.kind + "' lacks tensor '" + name + "'");
}

int64_t find_meta(const CacheState& s, const char* name) {
  auto it = s.meta.find(name);
  if (it == s.meta.end())
    throw Error(ErrorKind::Corrupt, std::string("cache state of kind '") + s.kind + "' lacks '" + name + "'");
  return it->second;
}
}  // namespace

KVView LayerCache::commit_direct() {
  throw Error(ErrorKind::Internal,
              std::string("commit_direct on a '") + kind() + "' cache, which takes no direct rows");
}

void KVCache::reserve(int64_t tokens, const Tensor& like_k, const Tensor& like_v) {
  if (keys_.defined() && keys_.dim(0) >= tokens) return;
  const int64_t cap = (tokens + kKvGrowStep - 1) / kKvGrowStep * kKvGrowStep;
  Tensor nk = Tensor::empty({cap, like_k.dim(1), like_k.dim(2)}, like_k.dtype(), like_k.device());
  Tensor nv = Tensor::empty({cap, like_v.dim(1), like_v.dim(2)}, like_v.dtype(), like_v.device());
  if (offset_ > 0) {
    copy_rows(nk, 0, keys_.slice(0, 0, offset_), 0, offset_);
    copy_rows(nv, 0, values_.slice(0, 0, offset_), 0, offset_);
  }
  keys_ = nk;
  values_ = nv;
}

KVView KVCache::update(const Tensor& k, const Tensor& v) {
  const int64_t T = k.dim(0);
  reserve(offset_ + T, k, v);
  copy_rows(keys_, offset_, k, 0, T);
  copy_rows(values_, offset_, v, 0, T);
  offset_ += T;
  return view();
}

KVView KVCache::view() const {
  KVView v;
  v.k = keys_.slice(0, 0, offset_);
  v.v = values_.slice(0, 0, offset_);
  v.pos0 = 0;
  return v;
}

std::optional<DirectRow> KVCache::direct_row(const Tensor& like) {
  reserve(offset_ + 1, like, like);
  return DirectRow{&keys_, &values_, offset_};
}

KVView KVCache::commit_direct() {
  ++offset_;
  return view();
}

CacheState KVCache::state() const {
  CacheState s;
  s.kind = kind();
  if (offset_ > 0) {
    s.tensors.emplace_back("keys", keys_.slice(0, 0, offset_).clone());
    s.tensors.emplace_back("values", values_.slice(0, 0, offset_).clone());
  }
  s.meta["offset"] = offset_;
  return s;
}

void KVCache::restore(const CacheState& s) {
  if (s.kind != kind())
    throw Error(ErrorKind::InvalidArgument, "cannot restore a '" + s.kind + "' state into a kv cache");
  const int64_t off = find_meta(s, "offset");
  keys_ = Tensor();
  values_ = Tensor();
  offset_ = 0;
  if (off == 0) return;
  const Tensor& k = find_tensor(s, "keys");
  const Tensor& v = find_tensor(s, "values");
  if (k.dim(0) != off || v.dim(0) != off)
    throw Error(ErrorKind::Corrupt, "kv cache state: offset " + std::to_string(off) + " but keys " + k.describe());
  update(k, v);
}

int64_t KVCache::trim(int64_t n) {
  n = std::min(std::max<int64_t>(n, 0), offset_);
  offset_ -= n;
  return n;
}

const void* KVCache::replay_buffer() const {
  if (!keys_.defined() || keys_.device() == Device::CPU || offset_ + 1 > keys_.dim(0)) return nullptr;
  return keys_.raw();
}

size_t KVCache::bytes() const { return keys_.defined() ? keys_.nbytes() + values_.nbytes() : 0; }

// ---- RotatingKVCache ----

Tensor RotatingKVCache::ordered(const Tensor& ring) const {
  if (filled_ < max_size_ || idx_ == 0) return ring.slice(0, 0, filled_).contiguous();
  Tensor out = Tensor::empty({filled_, ring.dim(1), ring.dim(2)}, ring.dtype(), ring.device());
  copy_rows(out, 0, ring, idx_, max_size_ - idx_);
  copy_rows(out, max_size_ - idx_, ring, 0, idx_);
  return out;
}

KVView RotatingKVCache::update(const Tensor& k, const Tensor& v) {
  const int64_t T = k.dim(0);
  if (!keys_.defined()) {
    keys_ = Tensor::empty({max_size_, k.dim(1), k.dim(2)}, k.dtype(), k.device());
    values_ = Tensor::empty({max_size_, v.dim(1), v.dim(2)}, v.dtype(), v.device());
  }
  KVView view;
  if (T == 1) {  // decode: write one slot, attend over the ring in place with explicit positions
    copy_rows(keys_, idx_, k, 0, 1);
    copy_rows(values_, idx_, v, 0, 1);
    const int64_t newest_slot = idx_;
    filled_ = std::min(filled_ + 1, max_size_);
    idx_ = (idx_ + 1) % max_size_;
    ++offset_;
    view.k = keys_.slice(0, 0, filled_);
    view.v = values_.slice(0, 0, filled_);
    view.positions.resize(static_cast<size_t>(filled_));
    for (int64_t s = 0; s < filled_; ++s) {
      const int64_t age = (newest_slot - s + max_size_) % max_size_;
      view.positions[static_cast<size_t>(s)] = offset_ - 1 - age;
    }
    return view;
  }
  // Prefill: attention sees the retained history plus all new tokens, in order; then keep the last max_size.
  const Tensor prev_k = ordered(keys_), prev_v = ordered(values_);
  const int64_t P = filled_, total = P + T;
  Tensor all_k = Tensor::empty({total, k.dim(1), k.dim(2)}, k.dtype(), k.device());
  Tensor all_v = Tensor::empty({total, v.dim(1), v.dim(2)}, v.dtype(), v.device());
  copy_rows(all_k, 0, prev_k, 0, P);
  copy_rows(all_v, 0, prev_v, 0, P);
  copy_rows(all_k, P, k, 0, T);
  copy_rows(all_v, P, v, 0, T);
  view.k = all_k;
  view.v = all_v;
  view.pos0 = offset_ - P;
  const int64_t keep = std::min(total, max_size_);
  copy_rows(keys_, 0, all_k, total - keep, keep);
  copy_rows(values_, 0, all_v, total - keep, keep);
  filled_ = keep;
  idx_ = keep % max_size_;
  offset_ += T;
  return view;
}

CacheState RotatingKVCache::state() const {
  CacheState s;
  s.kind = kind();
  if (filled_ > 0) {
    s.tensors.emplace_back("keys", keys_.slice(0, 0, filled_).clone());
    s.tensors.emplace_back("values", values_.slice(0, 0, filled_).clone());
  }
  s.meta["offset"] = offset_;
  s.meta["idx"] = idx_;
  s.meta["max_size"] = max_size_;
  s.meta["keep"] = 0;
  return s;
}

void RotatingKVCache::restore(const CacheState& s) {
  if (s.kind != kind())
    throw Error(ErrorKind::InvalidArgument, "cannot restore a '" + s.kind + "' state into a rotating cache");
  const int64_t max_size = find_meta(s, "max_size");
  if (max_size != max_size_)
    throw Error(ErrorKind::InvalidArgument, "rotating cache state has max_size " + std::to_string(max_size) +
                                                ", this layer's window is " + std::to_string(max_size_));
  offset_ = find_meta(s, "offset");
  idx_ = find_meta(s, "idx");
  filled_ = std::min(offset_, max_size_);
  keys_ = Tensor();
  values_ = Tensor();
  if (filled_ == 0) return;
  const Tensor& k = find_tensor(s, "keys");
  const Tensor& v = find_tensor(s, "values");
  if (k.dim(0) != filled_ || v.dim(0) != filled_ || idx_ < 0 || idx_ >= max_size_)
    throw Error(ErrorKind::Corrupt, "rotating cache state is inconsistent (offset " + std::to_string(offset_) +
                                        ", idx " + std::to_string(idx_) + ", keys " + k.describe() + ")");
  keys_ = Tensor::empty({max_size_, k.dim(1), k.dim(2)}, k.dtype(), k.device());
  values_ = Tensor::empty({max_size_, v.dim(1), v.dim(2)}, v.dtype(), v.device());
  copy_rows(keys_, 0, k, 0, filled_);
  copy_rows(values_, 0, v, 0, filled_);
}

int64_t RotatingKVCache::trim(int64_t n) {
  if (!can_trim(n)) return 0;
  offset_ -= n;
  filled_ -= n;
  idx_ = filled_ % max_size_;
  return n;
}

size_t RotatingKVCache::bytes() const { return keys_.defined() ? keys_.nbytes() + values_.nbytes() : 0; }

}  // namespace lathe
