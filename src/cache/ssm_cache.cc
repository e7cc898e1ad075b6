#include "cache/ssm_cache.h"

#include "common/error.h"

namespace lathe {
namespace {

Tensor& ensure(Tensor& t, const Shape& shape, const char* what, Device device) {
  if (!t.defined()) {
    t = Tensor::zeros(shape, DType::F32, device);
  } else if (t.shape() != shape) {
    throw Error(ErrorKind::InvalidArgument, std::string("ssm cache: ") + what + " state is " + t.describe() +
                                                ", the layer needs " + shape_str(shape));
  }
  return t;
}

}  // namespace

KVView SSMCache::update(const Tensor&, const Tensor&) {
  throw Error(ErrorKind::Internal, "ssm cache: a linear-attention layer has no keys/values to append");
}

Tensor& SSMCache::conv_state(int64_t rows, int64_t channels, Device device) {
  return ensure(conv_, {rows, channels}, "conv", device);
}

Tensor& SSMCache::recurrent_state(int64_t heads, int64_t v_dim, int64_t k_dim, Device device) {
  return ensure(recurrent_, {heads, v_dim, k_dim}, "recurrent", device);
}

CacheState SSMCache::state() const {
  CacheState s;
  s.kind = kind();
  if (conv_.defined()) s.tensors.emplace_back("conv", conv_.clone());
  if (recurrent_.defined()) s.tensors.emplace_back("recurrent", recurrent_.clone());
  s.meta["offset"] = offset_;
  return s;
}

void SSMCache::restore(const CacheState& s) {
  if (s.kind != kind())
    throw Error(ErrorKind::InvalidArgument, "cannot restore a '" + s.kind + "' state into an ssm cache");
  auto it = s.meta.find("offset");
  if (it == s.meta.end()) throw Error(ErrorKind::Corrupt, "ssm cache state lacks 'offset'");
  conv_ = Tensor();
  recurrent_ = Tensor();
  for (const auto& [name, t] : s.tensors) {
    if (t.dtype() != DType::F32)
      throw Error(ErrorKind::Corrupt, "ssm cache state: tensor '" + name + "' is " + t.describe() + ", expected F32");
    if (name == "conv") conv_ = t.clone();
    if (name == "recurrent") recurrent_ = t.clone();
  }
  if (it->second > 0 && (!conv_.defined() || !recurrent_.defined()))
    throw Error(ErrorKind::Corrupt, "ssm cache state at offset " + std::to_string(it->second) + " lacks its tensors");
  offset_ = it->second;
}

std::unique_ptr<LayerCache> SSMCache::fork(int64_t tokens) const {
  if (!can_fork(tokens)) return nullptr;
  auto out = std::make_unique<SSMCache>();
  if (conv_.defined()) out->conv_ = conv_.clone();
  if (recurrent_.defined()) out->recurrent_ = recurrent_.clone();
  out->offset_ = offset_;
  return out;
}

size_t SSMCache::bytes() const {
  return (conv_.defined() ? conv_.nbytes() : 0) + (recurrent_.defined() ? recurrent_.nbytes() : 0);
}

}  // namespace lathe
