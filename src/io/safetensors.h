// safetensors: 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}, then the
// data. Reading maps the file and validates every entry before any tensor is handed out; tensors alias the
// mapping (zero-copy). Writing streams tensors to path.tmp, fsyncs and renames.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/mapped_file.h"
#include "tensor/tensor.h"

namespace lathe {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets within the data section
};

class SafetensorsFile {
 public:
  // Throws Error(Corrupt/NotFound/Unsupported) naming the file (and tensor) on any inconsistency.
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return file_->path(); }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  Tensor get(const std::string& name) const;  // zero-copy view of the mapped bytes
  size_t file_size() const { return file_->size(); }

 private:
  std::shared_ptr<MappedFile> file_;
  size_t data_start_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

class SafetensorsWriter {
 public:
  // fill(dst) writes exactly numel * dtype_size bytes; called once, in order, while the file is written.
  using Fill = std::function<void(void* dst)>;
  void add(const std::string& name, DType dtype, const Shape& shape, Fill fill);
  void add(const std::string& name, const Tensor& t);  // CPU tensor, copied when written
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  void write(const std::string& path) const;  // atomic (io/atomic_file.h): path.tmp + fsync + rename

 private:
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    Fill fill;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace lathe
