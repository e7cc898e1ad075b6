// Helpers the CPU kernel tests share: running a block under one instruction set, and the attention masks every
// CPU attention kernel is checked under.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/cpu/cpu_features.h"
#include "tensor/ops.h"

namespace lathe::testutil {

// Runs the kernels under `isa` until the scope ends (tests pick each instruction set the CPU has).
class IsaScope {
 public:
  explicit IsaScope(cpu::Isa isa) : saved_(cpu::active_isa()) { cpu::set_isa_for_testing(isa); }
  ~IsaScope() { cpu::set_isa_for_testing(saved_); }
  IsaScope(const IsaScope&) = delete;
  IsaScope& operator=(const IsaScope&) = delete;

 private:
  cpu::Isa saved_;
};

struct AttentionCase {
  std::string name;
  AttentionParams params;
};

// `base` (causal, its scale and first query position), then each mask alone on top of it: a sliding window,
// explicit key positions (`positions`, e.g. a wrapped ring's order), a softcap, and (with non_causal) no
// causal mask.
inline std::vector<AttentionCase> attention_cases(const AttentionParams& base, int64_t window,
                                                  const std::vector<int64_t>* positions, float softcap,
                                                  bool non_causal = false) {
  std::vector<AttentionCase> cases{{"causal", base}, {"window", base}, {"positions", base}, {"softcap", base}};
  cases[1].params.window = window;
  cases[2].params.k_pos = positions;
  cases[3].params.softcap = softcap;
  if (non_causal) {
    cases.push_back({"non-causal", base});
    cases.back().params.causal = false;
  }
  return cases;
}

}  // namespace lathe::testutil
