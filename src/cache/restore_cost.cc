#include "cache/restore_cost.h"

#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/log.h"
#include "io/mapped_file.h"

namespace lathe {
namespace {

// Each new observation keeps this much of the sums before it: a handful of requests to follow a change.
constexpr double kRestoreCostDecay = 0.7;
// The seeds count as one prefill of this many tokens / one restore of this many bytes.
constexpr double kSeedPrefillTokens = 512;
constexpr double kSeedRestoreBytes = 256e6;
// Defaults: a CPU prefills a few hundred tokens a second at best (the 2-vCPU build machine: 300 at short
// prompts, ~30 at 4k); a datacenter GPU tens of thousands (the H200, Qwen3-4B: 11–15k). A restore is seeded at
// a slow SSD's rate, below the measured 1.7–2.8 GB/s, so a GPU recomputes until a restore has shown its rate.
constexpr double kSeedCpuPrefillTokS = 400;
constexpr double kSeedGpuPrefillTokS = 20000;
constexpr double kSeedRestoreMbS = 1000;
// Observations smaller than these are mostly fixed costs (a request's admission, a file's header): not rates.
constexpr int64_t kMinObservedPrefill = 64;
constexpr uint64_t kMinObservedRestore = uint64_t{1} << 20;
// A restore must be predicted this much faster than recomputing: near a tie the estimates' error (page-cache
// luck, a busy disk, attention's superlinear cost) decides, and recomputing risks no I/O.
constexpr double kRestoreMargin = 1.2;

bool rate_positive(double x) { return std::isfinite(x) && x > 0; }

}  // namespace

RestorePolicy parse_restore_policy(const std::string& s) {
  if (s == "auto") return RestorePolicy::Auto;
  if (s == "always") return RestorePolicy::Always;
  if (s == "never") return RestorePolicy::Never;
  throw Error(ErrorKind::InvalidArgument, "--ssd-restore must be auto, always or never, not '" + s + "'");
}

const char* restore_policy_name(RestorePolicy p) {
  switch (p) {
    case RestorePolicy::Always: return "always";
    case RestorePolicy::Never: return "never";
    default: return "auto";
  }
}

std::string RestoreDecision::describe(int64_t tokens, uint64_t bytes) const {
  char buf[200];
  std::snprintf(buf, sizeof buf, "%s %lld tokens: restore %.1f MB est. %.3f s, recompute est. %.3f s",
                restore ? "restoring" : "recomputing", static_cast<long long>(tokens), static_cast<double>(bytes) / 1e6,
                restore_s, recompute_s);
  return buf;
}

RestoreCostModel::RestoreCostModel(RestoreCostOptions options, Device device) : options_(options) {
  if (options_.prefill_tok_s < 0 || !std::isfinite(options_.prefill_tok_s))
    throw Error(ErrorKind::InvalidArgument, "--prefill-rate must be a positive number of tokens per second");
  if (options_.restore_mb_s < 0 || !std::isfinite(options_.restore_mb_s))
    throw Error(ErrorKind::InvalidArgument, "--ssd-read-rate must be a positive number of MB per second");
  const double prefill = options_.prefill_tok_s > 0 ? options_.prefill_tok_s
                         : device == Device::CPU    ? kSeedCpuPrefillTokS
                                                    : kSeedGpuPrefillTokS;
  const double restore = options_.restore_mb_s > 0 ? options_.restore_mb_s : kSeedRestoreMbS;
  prefill_amount_ = kSeedPrefillTokens;
  prefill_seconds_ = kSeedPrefillTokens / prefill;
  restore_amount_ = kSeedRestoreBytes;
  restore_seconds_ = kSeedRestoreBytes / (restore * 1e6);
}

RestoreDecision RestoreCostModel::decide(uint64_t bytes, int64_t tokens) const {
  RestoreDecision d;
  if (options_.policy != RestorePolicy::Auto) {
    d.restore = options_.policy == RestorePolicy::Always;
    return d;
  }
  d.restore_s = static_cast<double>(bytes) / 1e6 / restore_mb_s();
  d.recompute_s = static_cast<double>(std::max<int64_t>(tokens, 0)) / prefill_tok_s();
  d.restore = d.restore_s * kRestoreMargin < d.recompute_s;
  return d;
}

void RestoreCostModel::observe_prefill(int64_t tokens, double seconds) {
  if (!options_.learn || tokens < kMinObservedPrefill || !rate_positive(seconds)) return;
  const double keep = prefill_measured_ ? kRestoreCostDecay : 0;  // the first measurement replaces the seed
  prefill_amount_ = keep * prefill_amount_ + static_cast<double>(tokens);
  prefill_seconds_ = keep * prefill_seconds_ + seconds;
  prefill_measured_ = true;
}

void RestoreCostModel::observe_restore(uint64_t bytes, double seconds) {
  if (!options_.learn || bytes < kMinObservedRestore || !rate_positive(seconds)) return;
  const double keep = restore_measured_ ? kRestoreCostDecay : 0;
  restore_amount_ = keep * restore_amount_ + static_cast<double>(bytes);
  restore_seconds_ = keep * restore_seconds_ + seconds;
  restore_measured_ = true;
}

std::string RestoreCostModel::to_json() const {
  // Only what was measured: a seed is this start's flag, not a finding to keep.
  nlohmann::json j = nlohmann::json::object();
  if (prefill_measured_) j["prefill"] = {{"tokens", prefill_amount_}, {"seconds", prefill_seconds_}};
  if (restore_measured_) j["restore"] = {{"bytes", restore_amount_}, {"seconds", restore_seconds_}};
  return j.dump();
}

bool RestoreCostModel::from_json(const std::string& text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    if (!j.is_object()) return false;
    auto pair = [&](const char* key, const char* amount, double* a, double* s) {
      if (!j.contains(key)) return false;
      *a = j.at(key).at(amount).get<double>();
      *s = j.at(key).at("seconds").get<double>();
      if (!rate_positive(*a) || !rate_positive(*s)) throw Error(ErrorKind::Corrupt, "not a rate");
      return true;
    };
    double pa = 0, ps = 0, ra = 0, rs = 0;
    const bool p = pair("prefill", "tokens", &pa, &ps), r = pair("restore", "bytes", &ra, &rs);
    if (p) {
      prefill_amount_ = pa;
      prefill_seconds_ = ps;
      prefill_measured_ = true;
    }
    if (r) {
      restore_amount_ = ra;
      restore_seconds_ = rs;
      restore_measured_ = true;
    }
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

void RestoreCostModel::load(const std::string& path) {
  if (!options_.learn || options_.policy != RestorePolicy::Auto) return;
  try {
    if (!from_json(read_text_file(path))) log::warn("ssd cache: ignoring " + path + " (not the rates it should hold)");
  } catch (const std::exception& e) {
    log::debug(std::string("ssd cache: no learned restore rates yet: ") + e.what());
  }
}

void RestoreCostModel::save(const std::string& path) const {
  if (!options_.learn || options_.policy != RestorePolicy::Auto) return;
  try {
    const std::string s = to_json();
    write_file_atomic(path, s.data(), s.size());
  } catch (const std::exception& e) {
    log::debug(std::string("ssd cache: cannot keep the restore rates: ") + e.what());
  }
}

}  // namespace lathe
