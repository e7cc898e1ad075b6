// Which CPU kernel family runs, chosen once at run time from the CPU's features (one x86-64 binary runs on any
// machine). LATHE_CPU_ISA=scalar|avx2|avxvnni|avx512vnni|neondot lowers the choice (tests and comparisons); it never
// raises it past what the CPU has.
#pragma once

namespace lathe::cpu {

// Ordered by preference. AvxVnni: AVX2 + VEX vpdpbusd (Alder Lake and later, Zen 5); Avx512Vnni: AVX2 + EVEX
// vpdpbusd on 256-bit registers (AVX-512 VL + VNNI: Ice Lake server and later, Zen 4). A CPU may have the
// second and not the first, so a request for AvxVnni there falls back to Avx2. NeonDot: 64-bit Arm with the
// dot-product instructions (sdot: Armv8.2+, e.g. Neoverse N1/V1, Graviton 2+, Ampere Altra); an x86 CPU never
// has it and an Arm one none of the others, so lowering from it lands on the best the CPU has.
enum class Isa { Scalar, Avx2, AvxVnni, Avx512Vnni, NeonDot };

Isa detected_isa();                 // the best level this CPU supports
bool isa_supported(Isa isa);        // whether this CPU can run that level's kernels
Isa active_isa();                   // what the kernels use: detected, lowered by LATHE_CPU_ISA or set_isa_for_testing
void set_isa_for_testing(Isa isa);  // clamps to what the CPU has
const char* isa_name(Isa isa);

}  // namespace lathe::cpu
