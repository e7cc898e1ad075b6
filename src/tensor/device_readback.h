// A small device tensor copied back to the host behind the work queued before it, without waiting: the
// scheduler reads a step's sampled ids while the next step already runs on the GPU. One copy in flight at a time
// per object; CPU tensors are copied at once.
#pragma once
#include <cstddef>
#include <memory>

#include "tensor/tensor.h"

namespace lathe {

class DeviceReadback {
 public:
  DeviceReadback();
  ~DeviceReadback();
  DeviceReadback(const DeviceReadback&) = delete;
  DeviceReadback& operator=(const DeviceReadback&) = delete;
  // Queues the copy of t's bytes (contiguous); the previous copy's bytes are gone.
  void start(const Tensor& t);
  // Blocks until the copy has landed; the bytes stay valid until the next start().
  const void* wait();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lathe
