#include "tensor/cpu/cpu_features.h"

#include <atomic>
#include <cstdlib>
#include <string_view>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace lathe::cpu {
namespace {

Isa detect() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c".
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c) return Isa::Avx2;
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
