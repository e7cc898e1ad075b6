// `generate` and `chat`: a model bundle with the one sequence a terminal session runs, whose KV cache is
// reused across turns for the longest common prefix. The server runs many sequences through the scheduler
// (engine/scheduler.h) on the same bundle instead.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "engine/model_bundle.h"

namespace lathe {

class ChatSession : public ModelBundle {
 public:
  explicit ChatSession(const std::string& model_dir, const LoadOptions& load = {}, const CacheOptions& cache = {});

  // Generates after reusing the longest cached prefix of `prompt` (trimming the cache where the kind allows).
  GenerateResult generate(const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                          const std::function<void(const GeneratedToken&)>& on_token);
  void reset_cache();

 private:
  CacheList cache_;
  std::vector<int32_t> cached_tokens_;
  std::string cached_adapters_;  // the lora::ForwardContext key the cached KV was computed under
};

}  // namespace lathe
