// Process-wide settings of the C heap that tensor buffers come from.
#pragma once

namespace lathe {

// Keeps freed tensor buffers (up to 32 MiB each, 256 MiB of free heap top) in the process instead of handing
// them back to the kernel after every op. glibc's defaults trim the heap top once 2x the adaptive mmap
// threshold is free, so a forward pass that frees and reallocates its activations paid a page fault and a
// zeroed page for every 4 KiB of them, every op (Qwen3.5-0.8B shape, 512-token prefill: ~10% of the time).
// Long-lived processes give the memory back when idle (`lathe serve` trims between requests). Call once at
// start, before other threads; a GLIBC_TUNABLES setting of either threshold is left to rule.
void tune_heap_for_tensors();

}  // namespace lathe
