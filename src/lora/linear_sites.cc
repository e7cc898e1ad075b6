#include "lora/linear_sites.h"

#include <algorithm>
#include <cctype>

namespace lathe::lora {

int LinearSites::add(const std::string& module_in, int64_t out, int64_t in) {
  const std::string module = canonical_module(module_in);
  if (auto it = index_.find(module); it != index_.end()) return it->second;
  const int i = static_cast<int>(sites_.size());
  sites_.push_back({module, out, in});
  index_[module] = i;
  num_layers_ = std::max(num_layers_, layer_index(module) + 1);
  return i;
}

int LinearSites::find(const std::string& module) const {
  auto it = index_.find(canonical_module(module));
  return it == index_.end() ? -1 : it->second;
}

std::string canonical_module(std::string name) {
  for (const char* p : {"base_model.model.", "language_model."})
    if (name.rfind(p, 0) == 0) name = name.substr(std::string(p).size());
  return name;
}

int64_t layer_index(const std::string& module) {
  size_t pos = module.rfind("layers.", 0) == 0 ? 0 : module.find(".layers.");
  if (pos == std::string::npos) return -1;
  pos += module[pos] == '.' ? 8 : 7;
  size_t end = pos;
  while (end < module.size() && std::isdigit(static_cast<unsigned char>(module[end]))) ++end;
  if (end == pos || end - pos > 6 || (end < module.size() && module[end] != '.')) return -1;
  return std::stoll(module.substr(pos, end - pos));
}

}  // namespace lathe::lora
