#include "cache/quantized_kv_cache.h"

#include <algorithm>

#include "cache/kv_block_pool.h"
#include "common/error.h"
#include "tensor/ops_extra.h"

namespace lathe {
namespace {

const char* const kPartNames[] = {"keys", "keys_scales", "keys_biases", "values", "values_scales", "values_biases"};

void check_geometry(int bits, int group_size) {
  if (bits != 4 && bits != 8) throw Error(ErrorKind::InvalidArgument, "KV cache bits must be 4 or 8");
  if (group_size != 32 && group_size != 64) throw Error(ErrorKind::InvalidArgument, "KV group size must be 32 or 64");
}

// k/v [T, H, D] -> the six row tensors [T, H, ...], on k's device (F32 scales on the CPU, the activations'
// type on CUDA). A head smaller than the group size is one group (tiny test models have 16-wide heads; real
// ones are 64-256 wide).
RowTensors quantize_kv(const Tensor& k, const Tensor& v, int bits, int group_size) {
  RowTensors out;
  for (const Tensor* x : {&k, &v}) {
    const int64_t T = x->dim(0), H = x->dim(1), D = x->dim(2);
    const int gs = D < group_size ? static_cast<int>(D) : group_size;
    if (D % gs != 0 || (gs * bits) % 32 != 0)
      throw Error(ErrorKind::Unsupported, "quantized KV cache: head size " + std::to_string(D) +
                                              " is not a multiple of the group size " + std::to_string(gs));
    QuantizedMatrix q = quantize_kv(x->contiguous().reshape({T * H, D}), bits, gs);
    out.parts.push_back(q.w.reshape({T, H, -1}));
    out.parts.push_back(q.scales.reshape({T, H, -1}));
    out.parts.push_back(q.biases.reshape({T, H, -1}));
  }
  return out;
}

// The first n rows of a buffer as attention's view (rows token·H + head).
void fill_view(KVView& view, const RowTensors& buf, int64_t n, int bits) {
  const int64_t H = buf.parts[0].dim(1);
  QuantizedMatrix* mats[] = {&view.qk, &view.qv};
  for (int m = 0; m < 2; ++m) {
    QuantizedMatrix& q = *mats[m];
    q.w = buf.parts[static_cast<size_t>(3 * m)].slice(0, 0, n).reshape({n * H, -1});
    q.scales = buf.parts[static_cast<size_t>(3 * m + 1)].slice(0, 0, n).reshape({n * H, -1});
    q.biases = buf.parts[static_cast<size_t>(3 * m + 2)].slice(0, 0, n).reshape({n * H, -1});
    q.bits = bits;
    q.group_size = static_cast<int>(q.w.dim(1) * 32 / bits / q.scales.dim(1));  // the effective group
  }
  view.quantized = true;
  view.kv_heads = H;
}

void put_parts(CacheState& s, const RowTensors& rows) {
  for (size_t i = 0; i < rows.parts.size(); ++i) s.tensors.emplace_back(kPartNames[i], rows.parts[i].clone());
}

RowTensors get_parts(const CacheState& s, int64_t n) {
  RowTensors out;
  for (const char* name : kPartNames) {
    const Tensor* found = nullptr;
    for (const auto& [k, t] : s.tensors)
      if (k == name) found = &t;
    if (!found) throw Error(ErrorKind::Corrupt, "cache state of kind '" + s.kind + "' lacks tensor '" + name + "'");
    if (found->ndim() != 3 || found->dim(0) != n)
      throw Error(ErrorKind::Corrupt, "cache state of kind '" + s.kind + "': tensor '" + name + "' is " +
                                          found->describe() + ", expected " + std::to_string(n) + " rows");
    out.parts.push_back(*found);
  }
  return out;
}

int64_t get_meta(const CacheState& s, const char* name) {
  auto it = s.meta.find(name);
  if (it == s.meta.end()) throw Error(ErrorKind::Corrupt, "cache state of kind '" + s.kind + "' lacks '" + name + "'");
  return it->second;
}

void check_state_geometry(const CacheState& s, int bits, int gs) {
  if (get_meta(s, "bits") != bits || get_meta(s, "group_size") != gs)
    throw Error(ErrorKind::InvalidArgument, "cache state was quantized with " + std::to_string(get_meta(s, "bits")) +
                                                " bits / group " + std::to_string(get_meta(s, "group_size")) +
                                                ", this cache uses " + std::to_string(bits) + " / " +
                                                std::to_string(gs));
}

}  // namespace

// ---- QuantizedKVCache ----

QuantizedKVCache::QuantizedKVCache(int bits, int group_size) : bits_(bits), group_size_(group_size) {
  check_geometry(bits, group_size);
}

QuantizedKVCache::~QuantizedKVCache() = default;

void QuantizedKVCache::append(const RowTensors& rows) {
  const int64_t T = rows.rows();
  if (!decided_) {
    decided_ = true;
    paged_ = PagedRows::create(rows);
  }
  if (paged_) {
    paged_->make_room(offset_, offset_ + T);
    buf_ = paged_->rows();
  } else {
    grow(rows, offset_ + T);
  }
  buf_.copy_from(offset_, rows, 0, T);
  offset_ += T;
}

void QuantizedKVCache::grow(const RowTensors& like, int64_t rows) {
  if (buf_.defined() && buf_.rows() >= rows) return;
  std::vector<int64_t> row_bytes;
  for (const Tensor& p : like.parts) row_bytes.push_back(kv_row_bytes(p));
  RowTensors grown = RowTensors::empty_like(like, kv_grow_capacity(rows, row_bytes, like.parts[0].device()));
  if (offset_ > 0) grown.copy_from(0, buf_, 0, offset_);
  buf_ = grown;
}

RowTensors QuantizedKVCache::quantize(const Tensor& k, const Tensor& v) const {
  return quantize_kv(k, v, bits_, group_size_);
}

std::optional<QuantizedRowDest> QuantizedKVCache::next_row() {
  if (!decided_ || paged_ || !buf_.defined()) return std::nullopt;
  grow(buf_, offset_ + 1);
  QuantizedRowDest d;
  d.row = offset_;
  for (size_t i = 0; i < 6; ++i) {
    const Tensor& part = buf_.parts[i];
    if (!part.is_contiguous() || part.dim(0) == 0) return std::nullopt;
    d.bytes[i] = static_cast<int64_t>(part.nbytes()) / part.dim(0);
    d.base[i] = part.raw();
    d.dst[i] = static_cast<char*>(part.raw()) + offset_ * d.bytes[i];
  }
  return d;
}

bool QuantizedKVCache::graph_appendable() const {
  return decided_ && !paged_ && buf_.defined() && buf_.parts[0].device() != Device::CPU;
}

bool QuantizedKVCache::graph_prepare() {
  if (!graph_appendable()) return false;
  grow(buf_, offset_ + 1);
  return true;
}

std::optional<QuantizedRowDest> QuantizedKVCache::graph_append_quantized() {
  if (!graph_appendable()) return std::nullopt;
  auto d = next_row();
  if (d) ++offset_;
  return d;
}

KVView QuantizedKVCache::commit_row() {
  ++offset_;
  KVView view;
  fill_view(view, buf_, offset_, bits_);
  return view;
}

KVView QuantizedKVCache::update(const Tensor& k, const Tensor& v) {
  append(quantize_kv(k, v, bits_, group_size_));
  KVView view;
  fill_view(view, buf_, offset_, bits_);
  return view;
}

CacheState QuantizedKVCache::state() const {
  CacheState s;
  s.kind = kind();
  if (offset_ > 0) put_parts(s, buf_.slice(0, offset_));
  s.meta["offset"] = offset_;
  s.meta["bits"] = bits_;
  s.meta["group_size"] = group_size_;
  return s;
}

void QuantizedKVCache::restore(const CacheState& s) {
  if (s.kind != kind())
    throw Error(ErrorKind::InvalidArgument, "cannot restore a '" + s.kind + "' state into a quantized cache");
  check_state_geometry(s, bits_, group_size_);
  const int64_t off = get_meta(s, "offset");
  const RowTensors rows = off > 0 ? get_parts(s, off) : RowTensors();
  buf_ = RowTensors();
  paged_.reset();
  decided_ = false;
  offset_ = 0;
  if (off > 0) append(rows);
}

int64_t QuantizedKVCache::trim(int64_t n) {
  n = std::clamp<int64_t>(n, 0, offset_);
  offset_ -= n;
  if (paged_) paged_->keep(offset_);
  return n;
}

size_t QuantizedKVCache::bytes() const { return paged_ ? paged_->bytes() : buf_.nbytes(); }

std::unique_ptr<LayerCache> QuantizedKVCache::fork(int64_t tokens) const {
  if (!can_fork(tokens)) return nullptr;
  auto out = std::make_unique<QuantizedKVCache>(bits_, group_size_);
  out->decided_ = decided_;
  if (paged_) {
    out->paged_ = paged_->fork(tokens);
    out->buf_ = out->paged_->rows();
  } else if (tokens > 0) {
    out->grow(buf_, tokens);
    out->buf_.copy_from(0, buf_, 0, tokens);
  }
  out->offset_ = tokens;
  return out;
}

// ---- RotatingQuantizedKVCache ----

RotatingQuantizedKVCache::RotatingQuantizedKVCache(int64_t max_size, int bits, int group_size)
    : bits_(bits), group_size_(group_size), max_size_(max_size) {
  check_geometry(bits, group_size);
  if (max_size <= 0) throw Error(ErrorKind::InvalidArgument, "rotating cache needs a positive window");
}

RowTensors RotatingQuantizedKVCache::ordered() const {
  if (filled_ < max_size_ || idx_ == 0) return ring_.slice(0, filled_).clone();
  RowTensors out = RowTensors::empty_like(ring_, filled_);
  out.copy_from(0, ring_, idx_, max_size_ - idx_);
  out.copy_from(max_size_ - idx_, ring_, 0, idx_);
  return out;
}

KVView RotatingQuantizedKVCache::update(const Tensor& k, const Tensor& v) {
  const int64_t T = k.dim(0);
  const RowTensors rows = quantize_kv(k, v, bits_, group_size_);
  if (!ring_.defined()) ring_ = RowTensors::empty_like(rows, max_size_);
  KVView view;
  if (T == 1) {  // decode: write one slot, attend over the ring in place with explicit positions
    ring_.copy_from(idx_, rows, 0, 1);
    const int64_t newest_slot = idx_;
    filled_ = std::min(filled_ + 1, max_size_);
    idx_ = (idx_ + 1) % max_size_;
    ++offset_;
    fill_view(view, ring_, filled_, bits_);
    view.positions.resize(static_cast<size_t>(filled_));
    for (int64_t s = 0; s < filled_; ++s) {
      const int64_t age = (newest_slot - s + max_size_) % max_size_;
      view.positions[static_cast<size_t>(s)] = offset_ - 1 - age;
    }
    return view;
  }
  // Prefill: the retained history plus all new tokens, in order; then keep the last max_size.
  const int64_t P = filled_, total = P + T;
  RowTensors all = RowTensors::empty_like(rows, total);
  if (P > 0) all.copy_from(0, ordered(), 0, P);
  all.copy_from(P, rows, 0, T);
  fill_view(view, all, total, bits_);
  view.pos0 = offset_ - P;
  const int64_t keep = std::min(total, max_size_);
  ring_.copy_from(0, all, total - keep, keep);
  filled_ = keep;
  idx_ = keep % max_size_;
  offset_ += T;
  return view;
}

CacheState RotatingQuantizedKVCache::state() const {
  CacheState s;
  s.kind = kind();
  if (filled_ > 0) put_parts(s, ring_.slice(0, filled_));
  s.meta["offset"] = offset_;
  s.meta["idx"] = idx_;
  s.meta["max_size"] = max_size_;
  s.meta["keep"] = 0;
  s.meta["bits"] = bits_;
  s.meta["group_size"] = group_size_;
  return s;
}

void RotatingQuantizedKVCache::restore(const CacheState& s) {
  if (s.kind != kind())
    throw Error(ErrorKind::InvalidArgument, "cannot restore a '" + s.kind + "' state into a rotating quantized cache");
  check_state_geometry(s, bits_, group_size_);
  if (get_meta(s, "max_size") != max_size_)
    throw Error(ErrorKind::InvalidArgument, "rotating cache state has max_size " +
                                                std::to_string(get_meta(s, "max_size")) + ", this layer's window is " +
                                                std::to_string(max_size_));
  const int64_t off = get_meta(s, "offset"), idx = get_meta(s, "idx");
  const int64_t filled = std::min(off, max_size_);
  if (off < 0 || idx < 0 || idx >= max_size_)
    throw Error(ErrorKind::Corrupt, "rotating quantized cache state is inconsistent (offset " + std::to_string(off) +
                                        ", idx " + std::to_string(idx) + ")");
  ring_ = RowTensors();
  offset_ = off;
  idx_ = idx;
  filled_ = filled;
  if (filled == 0) return;
  const RowTensors rows = get_parts(s, filled);
  ring_ = RowTensors::empty_like(rows, max_size_);
  ring_.copy_from(0, rows, 0, filled);
}

std::unique_ptr<LayerCache> RotatingQuantizedKVCache::fork(int64_t tokens) const {
  if (!can_fork(tokens)) return nullptr;
  auto out = std::make_unique<RotatingQuantizedKVCache>(max_size_, bits_, group_size_);
  if (ring_.defined()) out->ring_ = ring_.clone();
  out->offset_ = offset_;
  out->filled_ = filled_;
  out->idx_ = idx_;
  out->trim(offset_ - tokens);
  return out;
}

int64_t RotatingQuantizedKVCache::trim(int64_t n) {
  if (n == 0 || !can_trim(n)) return 0;
  offset_ -= n;
  filled_ -= n;
  idx_ = filled_ % max_size_;
  return n;
}

// ---- the factory ----

void validate_cache_options(const CacheOptions& o) {
  if (o.kv_bits != 0) check_geometry(o.kv_bits, o.kv_group_size);
}

std::unique_ptr<LayerCache> make_attention_cache(int64_t window, const CacheOptions& o) {
  validate_cache_options(o);
  if (o.kv_bits == 0) {
    const DType cpu_store = o.cpu_kv_bf16 ? DType::BF16 : DType::F32;
    if (window > 0) return std::make_unique<RotatingKVCache>(window, cpu_store);
    return std::make_unique<PagedKVCache>(cpu_store);  // blocks shared copy-on-write on the CPU, contiguous elsewhere
  }
  if (window > 0) return std::make_unique<RotatingQuantizedKVCache>(window, o.kv_bits, o.kv_group_size);
  return std::make_unique<QuantizedKVCache>(o.kv_bits, o.kv_group_size);
}

}  // namespace lathe
