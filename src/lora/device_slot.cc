#include "lora/device_slot.h"

#include <cstring>

#include "lora/slot_table.h"

namespace lathe::lora {
namespace {
// a [r, in] of every factor, stacked along rows.
Tensor stack_a(const std::vector<const DeviceFactor*>& fs, int64_t rank, int64_t in, DType dt) {
  Tensor h = Tensor::empty({rank, in}, dt, Device::CPU);
  size_t off = 0;
  for (const DeviceFactor* f : fs) {
    const Tensor a = f->a.to(Device::CPU);
    std::memcpy(static_cast<char*>(h.raw()) + off, a.raw(), a.nbytes());
    off += a.nbytes();
  }
  return h.to(Device::CUDA);
}
// b [out, r] of every factor, side by side along columns.
Tensor stack_b(const std::vector<const DeviceFactor*>& fs, int64_t rank, int64_t out, DType dt) {
  Tensor h = Tensor::empty({out, rank}, dt, Device::CPU);
  const size_t es = dtype_size(dt);
  int64_t col = 0;
  for (const DeviceFactor* f : fs) {
    const Tensor b = f->b.to(Device::CPU);
    const int64_t r = b.dim(1);
    for (int64_t n = 0; n < out; ++n)
      std::memcpy(static_cast<char*>(h.raw()) + (n * rank + col) * es, static_cast<const char*>(b.raw()) + n * r * es,
                  static_cast<size_t>(r) * es);
    col += r;
  }
  return h.to(Device::CUDA);
}
}  // namespace

std::shared_ptr<const DeviceSlot> make_device_slot(const std::vector<std::vector<const DeviceFactor*>>& by_site) {
  DType dt = DType::F32;
  bool first = true;
  for (const auto& fs : by_site)
    for (const DeviceFactor* f : fs) {
      if (!f->a.defined() || !f->b.defined() || f->a.device() != Device::CUDA || f->b.device() != Device::CUDA ||
          !f->a.is_contiguous() || !f->b.is_contiguous() || f->a.dtype() != f->b.dtype() ||
          (f->a.dtype() != DType::F32 && f->a.dtype() != DType::BF16) || (!first && f->a.dtype() != dt))
        return nullptr;
      dt = f->a.dtype();
      first = false;
    }
  auto slot = std::make_shared<DeviceSlot>();
  slot->dtype = dt;
  const size_t n = by_site.size();
  std::vector<LoraSiteDesc> desc(n);
  slot->rank.assign(n, 0);
  // Every site's per-rank scales in one device array; the descriptors point into it.
  std::vector<float> scales;
  std::vector<size_t> scale_at(n, 0);
  for (size_t s = 0; s < n; ++s) {
    scale_at[s] = scales.size();
    for (const DeviceFactor* f : by_site[s]) scales.insert(scales.end(), static_cast<size_t>(f->a.dim(0)), f->scale);
  }
  Tensor scale_dev;
  if (!scales.empty()) {
    scale_dev = Tensor::from_floats(scales, {static_cast<int64_t>(scales.size())}).to(Device::CUDA);
    slot->owned.push_back(scale_dev);
  }
  for (size_t s = 0; s < n; ++s) {
    const auto& fs = by_site[s];
    if (fs.empty()) continue;
    int64_t rank = 0;
    for (const DeviceFactor* f : fs) rank += f->a.dim(0);
    LoraSiteDesc& d = desc[s];
    if (fs.size() == 1) {
      d.a = fs[0]->a.raw();
      d.b = fs[0]->b.raw();
    } else {
      Tensor a = stack_a(fs, rank, fs[0]->a.dim(1), dt), b = stack_b(fs, rank, fs[0]->b.dim(0), dt);
      d.a = a.raw();
      d.b = b.raw();
      slot->owned.push_back(std::move(a));
      slot->owned.push_back(std::move(b));
    }
    d.scale = scale_dev.data<float>() + scale_at[s];
    d.rank = static_cast<int32_t>(rank);
    slot->rank[s] = d.rank;
  }
  Tensor host = Tensor::empty({static_cast<int64_t>(n * sizeof(LoraSiteDesc))}, DType::U8, Device::CPU);
  if (n) std::memcpy(host.raw(), desc.data(), n * sizeof(LoraSiteDesc));
  slot->desc = host.to(Device::CUDA);
  return slot;
}

}  // namespace lathe::lora
