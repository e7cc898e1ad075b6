// Checks and views shared by the CUDA op dispatchers (ops_cuda*.cc): activations must be F32/BF16 device
// tensors, weights must live on the device too, and quantized matrices are handed to kernels as QuantViews.
#pragma once
#ifdef LATHE_HAVE_CUDA
#include <string>

#include "common/error.h"
#include "tensor/cuda/kernels.h"
#include "tensor/ops.h"

namespace lathe::gpu {

inline void require_act(const Tensor& x, const char* op) {
  if (x.device() != Device::CUDA || (x.dtype() != DType::F32 && x.dtype() != DType::BF16))
    throw Error(ErrorKind::InvalidArgument, std::string(op) + ": expects F32 or BF16 activations on cuda, got " +
                                                x.describe() + " on " + device_name(x.device()));
}

inline void require_device(const Tensor& t, const char* op) {
  if (t.defined() && t.device() != Device::CUDA)
    throw Error(ErrorKind::InvalidArgument,
                std::string(op) + ": weights are on the cpu but activations on cuda (load the model with device cuda)");
}

inline const float* f32_ptr(const Tensor* t, const char* op) {
  if (!t || !t->defined()) return nullptr;
  require_device(*t, op);
  if (t->dtype() != DType::F32 || !t->is_contiguous())
    throw Error(ErrorKind::Internal, std::string(op) + ": device vectors must be contiguous F32, got " + t->describe());
  return t->data<float>();
}

inline cuda::QuantView view(const QuantizedMatrix& q) {
  cuda::QuantView v;
  v.w = q.w.data<uint32_t>();
  v.scales = q.scales.raw();
  v.biases = q.biases.raw();
  v.sb_bf16 = q.scales.dtype() == DType::BF16;
  if (q.scales.dtype() != q.biases.dtype() || (!v.sb_bf16 && q.scales.dtype() != DType::F32))
    throw Error(ErrorKind::Internal, "quantized weight: device scales/biases must both be BF16 or F32");
  v.bits = q.bits;
  v.group_size = q.group_size;
  v.rows = q.rows();
  v.cols = q.cols();
  v.w_stride = q.w.stride(0);
  v.sb_stride = q.scales.stride(0);
  return v;
}

}  // namespace lathe::gpu
#endif
