// A slot's factors as the gathered CUDA kernels read them (tensor/lora_site_desc.h): one device array of
// LoraSiteDesc indexed by linear site, built once when the slot is created and immutable after, so a captured
// decode graph may keep pointing at it for as long as it holds the slot. A site with one factor points at that
// factor's tensors; a stacked site ("a+b") gets its own concatenated A [Σr, in] and B [out, Σr].
#pragma once
#include <memory>
#include <vector>

#include "tensor/lora_site_desc.h"
#include "tensor/tensor.h"

namespace lathe::lora {

struct DeviceFactor;

struct DeviceSlot {
  Tensor desc;                // device bytes: LoraSiteDesc[sites]
  DType dtype = DType::F32;   // of every factor (the activation type)
  std::vector<int32_t> rank;  // host copy of each site's rank (0 = none)
  std::vector<Tensor> owned;  // stacked factors and the per-rank scales the descriptors point into
  const LoraSiteDesc* sites() const { return static_cast<const LoraSiteDesc*>(desc.raw()); }
};

// Null unless every factor lives on a CUDA device, contiguous, in F32 or BF16, all of one type.
std::shared_ptr<const DeviceSlot> make_device_slot(const std::vector<std::vector<const DeviceFactor*>>& by_site);

}  // namespace lathe::lora
