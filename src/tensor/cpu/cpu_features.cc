#include "tensor/cpu/cpu_features.h"

#include <atomic>
#include <cstdlib>
#include <string_view>

namespace lathe::cpu {
namespace {

Isa detect() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    return Isa::Avx2;
#endif
  return Isa::Scalar;
}

Isa initial() {
  const Isa d = detected_isa();
  const char* env = std::getenv("LATHE_CPU_ISA");
  if (env && std::string_view(env) == "scalar") return Isa::Scalar;
  return d;
}

std::atomic<int>& current() {
  static std::atomic<int> isa{static_cast<int>(initial())};
  return isa;
}

}  // namespace

Isa detected_isa() {
  static const Isa isa = detect();
  return isa;
}

Isa active_isa() { return static_cast<Isa>(current().load(std::memory_order_relaxed)); }

void set_isa_for_testing(Isa isa) {
  if (static_cast<int>(isa) > static_cast<int>(detected_isa())) isa = detected_isa();
  current().store(static_cast<int>(isa));
}

const char* isa_name(Isa isa) { return isa == Isa::Avx2 ? "avx2" : "scalar"; }

}  // namespace lathe::cpu
