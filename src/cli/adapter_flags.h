// --adapter DIR (repeatable; mlx_lm's --adapter-path too) for run, generate, chat and serve: each directory is
// mounted under its folder name; run/generate/chat stack them all ("a+b", residuals summed in order), serve
// makes the stack its default.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "lora/adapter_manager.h"
#include "model/model.h"

namespace lathe::cli {

struct AdapterFlags {
  std::vector<std::string> dirs;

  void add_to(CLI::App* cmd) {
    cmd->add_option("--adapter,--adapter-path", dirs,
                    "LoRA adapter directory (mlx-lm or PEFT); repeat to stack adapters (residuals summed)");
  }
  // Mounts every directory on the model; returns the manager and the stacked selection in `sel`.
  std::shared_ptr<lora::AdapterManager> mount(const Model& model, lora::Selection* sel) const {
    auto m = std::make_shared<lora::AdapterManager>(model);
    std::string spec;
    for (const std::string& dir : dirs) {
      std::string id = dir;
      while (id.size() > 1 && id.back() == '/') id.pop_back();
      if (auto slash = id.rfind('/'); slash != std::string::npos) id = id.substr(slash + 1);
      for (auto& ch : id)
        if (ch == '+' || ch == ',' || ch == ' ') ch = '_';
      const std::string base = id;
      for (int n = 2; m->mounted(id); ++n) id = base + "-" + std::to_string(n);
      m->mount(id, dir);
      spec += (spec.empty() ? "" : "+") + id;
    }
    if (sel) *sel = m->resolve(spec);
    return m;
  }
};

}  // namespace lathe::cli
