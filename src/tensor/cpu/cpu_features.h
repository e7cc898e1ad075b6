// Which CPU kernel family runs, chosen once at run time from the CPU's features (one x86-64 binary runs on any
// machine). LATHE_CPU_ISA=scalar forces the portable kernels (tests and comparisons).
#pragma once

namespace lathe::cpu {

enum class Isa { Scalar, Avx2 };

Isa detected_isa();                 // what this CPU supports (AVX2 + FMA + F16C, or scalar)
Isa active_isa();                   // what the kernels use: detected, lowered by LATHE_CPU_ISA or set_isa_for_testing
void set_isa_for_testing(Isa isa);  // clamps to what the CPU has
const char* isa_name(Isa isa);

}  // namespace lathe::cpu
