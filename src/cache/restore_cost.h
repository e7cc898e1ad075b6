// Cost-aware restore: whether reading a stored prefix back from the SSD tier beats computing it again.
//
//   restore   ≈ bytes the restore reads / this store's restore rate (MB/s, running average)
//   recompute ≈ tokens the restore would save / this engine's prefill rate (tokens/s, running average)
//
// and a file is restored only when restore is predicted at least 20% faster than recompute (near a tie the
// estimates' error decides, and recomputing risks no I/O). Both rates start from seeds (flags, else per-device
// defaults that lean towards recomputing on a GPU and towards restoring on the CPU); the first real measurement
// replaces a seed, and later ones update a decayed sum of amounts over a decayed sum of seconds (prefills of 64
// tokens or more, restores of 1 MiB or more), so long prefills and large restores weigh most and old figures fade. The
// learned sums are kept in the SSD cache's identity folder, so a restarted server decides with what the last one
// measured.
//
// Why: on the H200 a 16k-token bf16 prefix is a 2.4 GB file that takes 1.5 s to read from a 1.7 GB/s disk, and
// 1.4 s to prefill; on the CPU the same tokens take minutes to prefill and a second to read. The prefill rate is
// linear in the tokens, while attention makes long prefills slower per token: the estimate from shorter prompts
// is then optimistic about recomputing, which errs on the side of the goal "an SSD hit is never slower than a
// cold request".
#pragma once
#include <cstdint>
#include <string>

#include "tensor/tensor.h"

namespace lathe {

enum class RestorePolicy { Auto, Always, Never };

// Parses "auto", "always", "never" (InvalidArgument otherwise).
RestorePolicy parse_restore_policy(const std::string& s);
const char* restore_policy_name(RestorePolicy p);

struct RestoreCostOptions {
  RestorePolicy policy = RestorePolicy::Auto;
  double prefill_tok_s = 0;  // seed; 0 = the device's default
  double restore_mb_s = 0;   // seed; 0 = the default
  bool learn = true;         // false: the seeds stay (tests, fixed policies)
};

struct RestoreDecision {
  bool restore = true;
  double restore_s = 0, recompute_s = 0;                       // the estimates behind it (0 under a fixed policy)
  std::string describe(int64_t tokens, uint64_t bytes) const;  // one log line's worth
};

class RestoreCostModel {
 public:
  RestoreCostModel(RestoreCostOptions options, Device device);

  // Restoring `bytes` (what the restore reads) instead of prefilling `tokens` (what it saves).
  RestoreDecision decide(uint64_t bytes, int64_t tokens) const;
  void observe_prefill(int64_t tokens, double seconds);
  void observe_restore(uint64_t bytes, double seconds);

  double prefill_tok_s() const { return prefill_amount_ / prefill_seconds_; }
  double restore_mb_s() const { return restore_amount_ / 1e6 / restore_seconds_; }
  RestorePolicy policy() const { return options_.policy; }

  // The learned sums as JSON, and back (a file that does not parse or holds nonsense is ignored: false).
  std::string to_json() const;
  bool from_json(const std::string& text);
  // Loads / writes (atomically) the sums at path; failures are logged at debug level and ignored.
  void load(const std::string& path);
  void save(const std::string& path) const;

 private:
  RestoreCostOptions options_;
  // Decayed sums (rate = amount / seconds); a seed until the first measurement.
  double prefill_amount_ = 0, prefill_seconds_ = 1;
  double restore_amount_ = 0, restore_seconds_ = 1;
  bool prefill_measured_ = false, restore_measured_ = false;
};

}  // namespace lathe
