// Hooks into the caching allocator for graph capture: blocks freed while a graph is captured stay reserved
// for that graph (its replays write them) until it is destroyed.
#pragma once
#include <cstddef>
#include <vector>

namespace lathe::cuda {

struct Block {
  void* ptr = nullptr;
  size_t size = 0;
};
// reuse: blocks freed during the capture may serve its later allocations (only for a capture that is one
// chain of kernels: with forked branches a reused block could be written by two at once).
void allocator_capture_begin(bool reuse = false);
std::vector<Block> allocator_capture_end();
void allocator_release(const std::vector<Block>& blocks);  // back to the free bins

}  // namespace lathe::cuda
