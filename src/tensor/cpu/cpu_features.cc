#include "tensor/cpu/cpu_features.h"

#include <atomic>
#include <cstdlib>
#include <string_view>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)  // the kernel's bit for the dot-product instructions
#endif
#endif

namespace lathe::cpu {
namespace {

struct Features {
  bool avx2 = false, avx_vnni = false, avx512_vnni = false, neon_dot = false;
};

Features probe_cpu() {
  Features f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c".
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
  f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  if (!f.avx2) return f;
  // AVX-VNNI: CPUID leaf 7 subleaf 1, EAX bit 4 (VEX-encoded, so the OS's AVX state support is enough).
  f.avx_vnni = __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 4)) != 0;
  // __builtin_cpu_supports checks the OS saves the AVX-512 state too.
  f.avx512_vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#endif
#if defined(__aarch64__)
  f.neon_dot = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#endif
  return f;
}

const Features& cpu_flags() {
  static const Features f = probe_cpu();
  return f;
}

Isa isa_at_most(Isa isa) {
  while (isa != Isa::Scalar && !isa_supported(isa)) isa = static_cast<Isa>(static_cast<int>(isa) - 1);
  return isa;
}

Isa initial() {
  Isa isa = detected_isa();
  if (const char* env = std::getenv("LATHE_CPU_ISA")) {
    const std::string_view e(env);
    Isa want = isa;
    if (e == "scalar") want = Isa::Scalar;
    if (e == "avx2") want = Isa::Avx2;
    if (e == "avxvnni") want = Isa::AvxVnni;
    if (e == "avx512vnni" || e == "avx512") want = Isa::Avx512Vnni;
    if (e == "neondot") want = Isa::NeonDot;
    if (static_cast<int>(want) < static_cast<int>(isa)) isa = isa_at_most(want);
  }
  return isa;
}

std::atomic<int>& current() {
  static std::atomic<int> isa{static_cast<int>(initial())};
  return isa;
}

}  // namespace

bool isa_supported(Isa isa) {
  const Features& f = cpu_flags();
  switch (isa) {
    case Isa::Scalar: return true;
    case Isa::Avx2: return f.avx2;
    case Isa::AvxVnni: return f.avx_vnni;
    case Isa::Avx512Vnni: return f.avx512_vnni;
    case Isa::NeonDot: return f.neon_dot;
  }
  return false;
}

Isa detected_isa() {
  static const Isa isa = isa_at_most(Isa::NeonDot);
  return isa;
}

Isa active_isa() { return static_cast<Isa>(current().load(std::memory_order_relaxed)); }

void set_isa_for_testing(Isa isa) { current().store(static_cast<int>(isa_at_most(isa))); }

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::AvxVnni: return "avxvnni";
    case Isa::Avx512Vnni: return "avx512vnni";
    case Isa::NeonDot: return "neondot";
  }
  return "?";
}

}  // namespace lathe::cpu
