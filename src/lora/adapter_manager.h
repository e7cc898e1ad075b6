// Mounted LoRA adapters of one served model: mount under an id (validated against the model's linear sites
// before anything is attached: all or nothing), unmount, list, and resolve a request's spec ("a", "a+b",
// "a,b", "none", or "" for the default) into a slot of the current SlotTable. Thread-safe; see slot_table.h for
// why a streaming request is never disturbed by a mount or unmount.
#pragma once
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "lora/forward_context.h"
#include "lora/linear_sites.h"
#include "lora/slot_table.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace lathe {
class Model;
}

namespace lathe::lora {

constexpr int kMaxAdapterIdLength = 128;
constexpr int kMaxSlots = 256;  // distinct adapter sets in use at once

struct AdapterInfo {
  std::string id, dir, format, base_model;
  int64_t rank = 0;
  float scale = 1.0f;
  size_t modules = 0, skipped = 0, weights_bytes = 0, device_bytes = 0;
  std::string content_hash;  // what the prompt cache keys this adapter's KV by (see MountedAdapter)
};

// A resolved spec: the snapshot to pin for the request and its slot (-1 = base model).
struct Selection {
  std::shared_ptr<const SlotTable> table;
  int slot = -1;
  std::string spec;  // canonical ("" for the base)
  ForwardContext context() const;
};

class AdapterManager {
 public:
  // cpu_bf16: on the CPU, keep factors in BF16 for lora/cpu_residual.h (the default path) instead of F32
  // through the dense ops (--exact, which the parity suites use). Ignored on other devices.
  AdapterManager(std::shared_ptr<const LinearSites> sites, Device device, DType dtype, bool cpu_bf16 = false);
  explicit AdapterManager(const Model& model);  // cpu_bf16 unless the model was loaded with exact

  // Throws: InvalidArgument (bad or taken id), NotFound (no adapter in dir), Corrupt/Unsupported (files), or
  // InvalidArgument naming the module and both shapes when the adapter does not fit this model.
  AdapterInfo mount(const std::string& id, const std::string& dir);
  // Throws NotFound listing what is mounted. Drops the id from the default spec.
  void unmount(const std::string& id);
  std::vector<AdapterInfo> list() const;
  bool mounted(const std::string& id) const;
  // "" = the default (base when none); "none" = base. Unknown ids: NotFound listing what is mounted.
  Selection resolve(const std::string& spec);
  void set_default(const std::string& spec);  // validated like a request's spec
  std::string default_spec() const;
  std::shared_ptr<const SlotTable> snapshot() const;
  // "" when the adapter in dir would mount on this model, else why not (nothing is attached).
  std::string misfit(const std::string& dir) const;
  const LinearSites& sites() const { return *sites_; }

 private:
  // Reads and validates the adapter in dir; with upload, its factors go to the model's device.
  std::shared_ptr<MountedAdapter> build(const std::string& id, const std::string& dir, bool upload) const;
  std::vector<std::string> parse_spec(const std::string& spec) const;  // requires mu_
  std::string mounted_list() const;                                    // requires mu_
  std::shared_ptr<const LinearSites> sites_;
  Device device_;
  DType dtype_;
  bool cpu_bf16_ = false;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<const MountedAdapter>> adapters_;  // mount order
  std::shared_ptr<const SlotTable> table_;
  std::vector<std::string> default_;
  uint64_t next_serial_ = 1;
};

// Checks an adapter id: 1..128 characters of letters, digits and ._-:/@ (no '+' or ','), not "none".
void validate_adapter_id(const std::string& id);

}  // namespace lathe::lora
