#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "io/atomic_file.h"
#include "io/json_guard.h"

namespace lathe {
namespace {

constexpr uint64_t kMaxHeader = 100ull << 20;

[[noreturn]] void corrupt(const std::string& path, const std::string& what) {
  throw Error(ErrorKind::Corrupt, path + ": " + what);
}

}  // namespace

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto f = std::shared_ptr<SafetensorsFile>(new SafetensorsFile());
  f->file_ = MappedFile::open(path);
  const size_t size = f->file_->size();
  if (size < 8)
    corrupt(path, "file is truncated (" + std::to_string(size) + " bytes; the 8-byte header length is missing)");
  uint64_t hlen = 0;
  std::memcpy(&hlen, f->file_->data(), 8);
  if (hlen > kMaxHeader)
    corrupt(path, "header length " + std::to_string(hlen) + " is implausible (not a safetensors file?)");
  if (hlen > size - 8)
    corrupt(path, "file is truncated: header length " + std::to_string(hlen) + " exceeds the " +
                      std::to_string(size - 8) + " bytes after it");
  f->data_start_ = 8 + hlen;
  const uint64_t data_size = size - f->data_start_;
  const nlohmann::json header =
      io::parse_json_checked(std::string_view(reinterpret_cast<const char*>(f->file_->data()) + 8, hlen),
                             io::file_json_limits(), ErrorKind::Corrupt, path + ": header is not valid JSON");
  if (!header.is_object()) corrupt(path, "header is not a JSON object");

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == "__metadata__") {
      if (v.is_object())
        for (auto m = v.begin(); m != v.end(); ++m)
          if (m.value().is_string()) f->metadata_[m.key()] = m.value().get<std::string>();
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      corrupt(path, where + " lacks dtype/shape/data_offsets");
    TensorInfo info;
    info.name = name;
    if (!v["dtype"].is_string()) corrupt(path, where + " has a non-string dtype");
    const std::string dt = v["dtype"].get<std::string>();
    if (!dtype_from_name(dt, &info.dtype))
      throw Error(ErrorKind::Unsupported, path + ": " + where + " has unsupported dtype " + dt);
    if (!v["shape"].is_array()) corrupt(path, where + " has a non-array shape");
    if (v["shape"].size() > 8) corrupt(path, where + " has more than 8 dimensions");
    // The element count must fit the data section; checked per factor so that a product cannot wrap around.
    uint64_t elements = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) corrupt(path, where + " has an invalid dimension");
      const uint64_t dim = static_cast<uint64_t>(d.get<int64_t>());
      if (dim != 0 && elements > data_size / dim)
        elements = data_size + 1;  // too many, whatever the rest
      else
        elements *= dim;
      info.shape.push_back(d.get<int64_t>());
    }
    if (elements > data_size && elements != 0)
      corrupt(path, where + " has shape " + shape_str(info.shape) + ", more elements than the file holds bytes");
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      corrupt(path, where + " has invalid data_offsets");
    info.begin = off[0].get<uint64_t>();
    info.end = off[1].get<uint64_t>();
    if (info.begin > info.end) corrupt(path, where + " has data_offsets with begin > end");
    if (info.end > data_size)
      corrupt(path, where + " data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) +
                        ") run past the end of the file (data section is " + std::to_string(data_size) +
                        " bytes; truncated?)");
    const uint64_t expect = static_cast<uint64_t>(shape_numel(info.shape)) * dtype_size(info.dtype);
    if (info.end - info.begin != expect)
      corrupt(path, where + " holds " + std::to_string(info.end - info.begin) + " bytes but " + dt +
                        shape_str(info.shape) + " needs " + std::to_string(expect));
    f->tensors_[name] = std::move(info);
  }

  std::vector<const TensorInfo*> by_offset;
  for (const auto& [n, info] : f->tensors_) by_offset.push_back(&info);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  const TensorInfo* last = nullptr;  // the non-empty tensor reaching furthest so far
  for (const TensorInfo* t : by_offset) {
    if (t->end == t->begin) continue;
    if (last && t->begin < last->end)
      corrupt(path, "tensors '" + last->name + "' and '" + t->name + "' overlap in the data section");
    if (!last || t->end > last->end) last = t;
  }
  return f;
}

Tensor SafetensorsFile::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw Error(ErrorKind::NotFound, path() + ": no tensor named '" + name + "'");
  const TensorInfo& info = it->second;
  void* p = const_cast<unsigned char*>(file_->data() + data_start_ + info.begin);
  return Tensor::alias(p, info.shape, info.dtype, file_);
}

void SafetensorsWriter::add(const std::string& name, DType dtype, const Shape& shape, Fill fill) {
  entries_.push_back({name, dtype, shape, std::move(fill)});
}

void SafetensorsWriter::add(const std::string& name, const Tensor& t) {
  Tensor c = t.device() == Device::CPU ? t.contiguous() : t.to(Device::CPU);
  add(name, c.dtype(), c.shape(), [c](void* dst) { std::memcpy(dst, c.raw(), c.nbytes()); });
}

void SafetensorsWriter::write(const std::string& path) const {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  // Laid out widest dtype first (as the safetensors library does), so every tensor starts at a multiple of its
  // element size: kernels read u32 codes and f32 values in place from the mapping. Fills still run in the order
  // they were added (the quantizer relies on it); each lands at its offset.
  std::vector<size_t> layout(entries_.size());
  for (size_t i = 0; i < layout.size(); ++i) layout[i] = i;
  std::stable_sort(layout.begin(), layout.end(),
                   [&](size_t a, size_t b) { return dtype_size(entries_[a].dtype) > dtype_size(entries_[b].dtype); });
  std::vector<uint64_t> offsets(entries_.size());
  uint64_t off = 0;
  for (size_t i : layout) {
    const auto& e = entries_[i];
    const uint64_t n = static_cast<uint64_t>(shape_numel(e.shape)) * dtype_size(e.dtype);
    header[e.name] = {{"dtype", dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {off, off + n}}};
    offsets[i] = off;
    off += n;
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');  // keep the data section 8-byte aligned
  AtomicFile file(path);  // removed on every way out but a commit that succeeded (a fill that throws too)
  const uint64_t hlen = h.size();
  file.write_at(0, &hlen, 8);
  file.write_at(8, h.data(), h.size());
  const uint64_t data_start = 8 + hlen;
  std::vector<char> buf;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const auto& e = entries_[i];
    const size_t n = static_cast<size_t>(shape_numel(e.shape)) * dtype_size(e.dtype);
    buf.resize(n);
    e.fill(buf.data());
    file.write_at(data_start + offsets[i], buf.data(), n);
  }
  file.commit(data_start + off);
}

}  // namespace lathe
