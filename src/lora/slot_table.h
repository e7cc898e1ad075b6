// What a forward step reads to add LoRA residuals: an immutable snapshot of the mounted adapters grouped into
// slots. A slot is one adapter set as a request names it ("a", "a+b"); for every linear site it lists the
// factors to add, in order. BatchRow::adapter_slot indexes these slots (-1 = base model).
//
// Lock design: the AdapterManager builds a new SlotTable on every mount, unmount or new slot and swaps a
// shared_ptr under its mutex; a request pins the snapshot it started with, so mounting or unmounting while
// another request streams never changes (or frees) what that request reads. Unmounted factors are freed when
// the last snapshot that holds them goes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace lathe::lora {

struct CpuFactor;   // lora/cpu_residual.h
struct DeviceSlot;  // lora/device_slot.h

// One adapter's factors for one linear, on the model's device in its activation type (F32 on the CPU under
// --exact). On the CPU's default path only `cpu` is set: BF16 copies for lora/cpu_residual.h.
struct DeviceFactor {
  Tensor a;  // [r, in]
  Tensor b;  // [out, r]
  float scale = 1.0f;
  std::shared_ptr<const CpuFactor> cpu;
};

struct MountedAdapter {
  std::string id, dir, format, base_model;
  int64_t rank = 0;
  float scale = 1.0f;
  size_t weights_bytes = 0, device_bytes = 0;
  size_t modules = 0, skipped = 0;
  uint64_t serial = 0;  // unique per mount in this process
  // What the factors compute, never where they came from: a 32-hex digest over every attached factor (its
  // linear site, shapes, F32 values and scale, in site order). The prompt cache keys adapter KV by it.
  std::string content_hash;
  std::vector<std::pair<int, DeviceFactor>> factors;  // (linear site, factor)
};

struct Slot {
  std::string spec;  // canonical: ids joined by '+', in the order given
  std::vector<std::shared_ptr<const MountedAdapter>> adapters;
  std::vector<std::vector<const DeviceFactor*>> by_site;   // [site] -> factors to add, in order
  std::vector<std::vector<const CpuFactor*>> cpu_by_site;  // the same as CPU kernel factors (default CPU path)
  std::shared_ptr<const DeviceSlot> device;                // the same for the gathered CUDA kernels; null off CUDA
};

struct SlotTable {
  std::vector<std::shared_ptr<const Slot>> slots;  // null = a free slot number
  const Slot* slot(int i) const {
    return i >= 0 && static_cast<size_t>(i) < slots.size() ? slots[static_cast<size_t>(i)].get() : nullptr;
  }
};

}  // namespace lathe::lora
