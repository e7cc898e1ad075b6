// GET /v1/cache: the prompt cache's tiers (entries, bytes, hits and misses, restore time and read rate).
#include <httplib.h>

#include "cache/kv_block_pool.h"
#include "server/http_server.h"

namespace lathe::server {

std::vector<Route> cache_routes(ServerContext& ctx) {
  std::vector<Route> r;
  r.push_back({"GET", "/v1/cache", [&ctx](const httplib::Request&, httplib::Response& res) {
                 using json = nlohmann::ordered_json;
                 const CacheTierStats c = ctx.metrics().cache_tiers();
                 json ram = {{"entries", c.ram_entries},
                             {"bytes", c.ram_bytes},
                             {"hits", c.ram_hits},
                             {"misses", c.ram_misses},
                             {"reused_tokens", c.ram_reused_tokens}};
                 // The CPU's paged KV blocks (running and kept sequences): bytes counts a shared block once,
                 // block_refs as often as caches map it, resident_bytes the pages written.
                 const KvPoolStats pool = kv_pool_stats();
                 ram["pool_blocks"] = pool.blocks;
                 ram["pool_bytes"] = pool.bytes;
                 ram["pool_block_refs"] = pool.references;
                 ram["pool_resident_bytes"] = pool.resident;  // the blocks' pages that exist (written rows)
                 json out = {{"object", "cache"}, {"ram", ram}, {"ssd", nullptr}};
                 // The last request's engine-side split of its time to first token (attach vs prefill).
                 out["last_request"] = {{"attach_ms", c.last_attach_ms},
                                        {"prefill_ms", c.last_prefill_ms},
                                        {"prefill_tokens", c.last_prefill_tokens}};
                 if (const SsdStore* store = ctx.ssd_store()) {
                   const SsdStoreStats s = store->stats();
                   const double avg = c.ssd_hits > 0 ? c.ssd_restore_ms_total / static_cast<double>(c.ssd_hits) : 0;
                   out["ssd"] = {{"dir", store->root()},
                                 {"entries", s.entries},
                                 {"bytes", s.bytes},
                                 {"hits", c.ssd_hits},
                                 {"misses", c.ssd_misses},
                                 {"reused_tokens", c.ssd_reused_tokens},
                                 {"spills", s.spills},
                                 {"spills_queued", c.spills_queued},
                                 {"write_failures", s.write_failures},
                                 {"removed_invalid", s.removed_invalid},
                                 {"removed_tmp", s.removed_tmp},
                                 {"restore_ms_last", s.restore_ms_last},
                                 {"restore_ms_avg", avg},
                                 {"read_mb_s_last", s.restore_mb_s_last},
                                 {"read_bytes_last", s.restore_bytes_last},
                                 {"restore_wait_ms_last", s.restore_wait_ms_last},
                                 {"restore_copy_ms_last", s.restore_copy_ms_last},
                                 // Cost-aware restore (restore_cost.h): the rates it predicts with, how often
                                 // it chose to recompute, and its last estimates.
                                 {"skipped", c.ssd_skipped},
                                 {"prefill_tok_s_est", c.prefill_tok_s},
                                 {"restore_mb_s_est", c.restore_mb_s},
                                 {"last_decision", c.last_restore_est_s == 0 && c.last_recompute_est_s == 0
                                                       ? json(nullptr)
                                                       : json({{"restore", c.last_decision_restore},
                                                               {"restore_s_est", c.last_restore_est_s},
                                                               {"recompute_s_est", c.last_recompute_est_s}})}};
                 }
                 write_json(res, out);
               }});
  return r;
}

}  // namespace lathe::server
