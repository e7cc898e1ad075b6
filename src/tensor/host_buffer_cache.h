// Freed CPU tensor buffers (64 KiB and up), kept by size class for the next tensor of that class: a forward pass
// allocates the same shapes layer after layer and chunk after chunk, and the most recently freed buffer of a class
// is the one reused, its pages still mapped. Handed to glibc instead (even with tune_heap_for_tensors), the next
// buffers were faulted in anew: a 4,000-token prefill of the Qwen3-0.6B shape (2,048-token chunks, ~176 MiB of
// activations per layer) took 2.3 M page faults, 1.4 M with the old 16 MiB cap, 0.3 M now (the weights and the
// KV cache), and ran 1.3-1.6x faster.
#pragma once
#include <cstddef>

namespace lathe {

// A buffer of at least `bytes` (rounded up to its size class, 64-byte aligned), recycled when one is free;
// *capacity is set to the class size, which release_host_buffer() takes back. Out of memory is an OsError of
// ENOMEM (common/os_error.h; the server answers 503 insufficient_memory).
void* acquire_host_buffer(size_t bytes, size_t* capacity);
void release_host_buffer(void* p, size_t capacity);

// Frees cached buffers until at most keep_bytes stay (least recently freed first): an idle server hands a
// request's working set back to the OS instead of keeping it resident.
void trim_host_buffers(size_t keep_bytes);
// Bytes cached now, and the most the cache keeps (a sixteenth of physical memory, 64 MiB to 4 GiB; or
// LATHE_HOST_BUFFER_CACHE_MB).
size_t host_buffer_cached_bytes();
size_t host_buffer_cache_cap();
// Makes the pages of [p, p + bytes) that it wholly covers in one call (MADV_POPULATE_WRITE) instead of one fault
// (a trap, costly in a VM) each, for memory about to be written whole; a no-op where the kernel lacks it.
void populate_host_pages(void* p, size_t bytes);
// What an idle server keeps (the old fixed cap): enough for a decode step's buffers.
inline constexpr size_t kIdleHostBufferBytes = size_t{16} << 20;

}  // namespace lathe
