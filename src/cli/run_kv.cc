#include "cli/run_kv.h"

#include <chrono>

#include "cache/cache_identity.h"
#include "cache/kv_file.h"
#include "common/error.h"

namespace lathe::cli {
// A named namespace: a unity batch that joins this file with run.cc would see two anonymous ms_since.
namespace run_kv_detail {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }
}  // namespace run_kv_detail

KvRestoreResult restore_kv_for_prompt(Model& model, const CacheOptions& options, const std::string& path, bool verify,
                                      const std::vector<int32_t>& prompt, CacheList& caches, const std::string& ns) {
  CacheIdentity id = cache_identity(model, options);
  id.meta.ns = ns;
  const CacheLayout layout = probe_cache_layout(model, options);
  const auto t0 = run_kv_detail::Clock::now();
  KvLoadOptions lo;
  lo.expect = &id.meta;
  lo.verify = verify;
  CacheList restored = model.make_cache(options);
  const KvFileHeader h = load_kv_file(path, layout, restored, lo);
  size_t common = 0;
  while (common < h.tokens.size() && common + 1 < prompt.size() && h.tokens[common] == prompt[common]) ++common;
  if (common == 0)
    throw Error(ErrorKind::InvalidArgument,
                path + ": shares no prefix with --ids (one prompt token must be left to run)");
  const int64_t drop = static_cast<int64_t>(h.tokens.size() - common);
  for (const auto& c : restored)
    if (drop > 0 && !c->can_trim(drop))
      throw Error(ErrorKind::InvalidArgument, path + ": holds " + std::to_string(h.tokens.size()) +
                                                  " tokens, the prompt shares " + std::to_string(common) + ", and a '" +
                                                  c->kind() + "' cache cannot drop the rest");
  if (drop > 0)
    for (const auto& c : restored) c->trim(drop);
  caches = std::move(restored);
  KvRestoreResult r;
  r.reused = static_cast<int64_t>(common);
  r.ms = run_kv_detail::ms_since(t0);
  r.file_bytes = h.file_size;
  return r;
}

KvSaveResult save_kv_for_prompt(const Model& model, const CacheOptions& options, const std::string& path,
                                const std::vector<int32_t>& tokens, const CacheList& caches, const std::string& ns) {
  CacheIdentity id = cache_identity(model, options);
  id.meta.ns = ns;
  const auto t0 = run_kv_detail::Clock::now();
  KvSaveResult r;
  r.file_bytes = save_kv_file(path, tokens, caches, id.meta);
  r.ms = run_kv_detail::ms_since(t0);
  return r;
}

}  // namespace lathe::cli
