#include "lab/train/lora_dropout.h"

#include "common/error.h"

namespace lathe::train {
namespace {

// SplitMix64's finaliser: a bijective 64-bit mix, enough to decorrelate neighbouring counters.
uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t combine(uint64_t h, uint64_t v) { return mix(h ^ (v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2))); }

}  // namespace

uint64_t dropout_stream(const LoraDropout& d, int64_t sequence, int64_t layer, int64_t module) {
  uint64_t h = mix(d.seed ^ 0xD1B54A32D192ED03ull);  // a domain apart from the LoRA init streams
  for (int64_t v : {d.step, d.micro, sequence, layer, module}) h = combine(h, static_cast<uint64_t>(v));
  return h;
}

std::shared_ptr<const std::vector<float>> dropout_mask(uint64_t stream, int64_t n, double p) {
  LATHE_CHECK(p > 0 && p < 1 && n >= 0, "dropout_mask: p must be in (0, 1)");
  const float keep = static_cast<float>(1.0 / (1.0 - p));
  // Dropped when the element's uniform u = top 53 bits / 2^53 falls below p.
  const uint64_t threshold = static_cast<uint64_t>(p * 9007199254740992.0);
  auto m = std::make_shared<std::vector<float>>(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    (*m)[static_cast<size_t>(i)] =
        (mix(stream + static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull) >> 11) < threshold ? 0.0f : keep;
  return m;
}

}  // namespace lathe::train
