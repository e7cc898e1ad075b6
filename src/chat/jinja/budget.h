// The resources one render may use: evaluation steps (time), the size of any one string or list and of the
// output (memory), and a cancellation flag. A render installs its budget for the thread it runs on, so the
// operators and filters deep in the evaluator check it without being passed it. Exceeding it is an
// Error(InvalidArgument) that says which limit was hit.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace lathe::jinja {

struct RenderLimits {
  uint64_t max_steps;
  size_t max_string_bytes;  // any one string, the output included
  size_t max_list_items;
  const std::atomic<bool>* cancel = nullptr;  // set: the render stops with an error at the next step
};

// The defaults from common/limits.h.
RenderLimits default_render_limits();

class RenderBudget {
 public:
  explicit RenderBudget(const RenderLimits& limits);
  ~RenderBudget();
  RenderBudget(const RenderBudget&) = delete;
  RenderBudget& operator=(const RenderBudget&) = delete;

  // `weight` evaluation steps on this thread's render (a no-op outside a render); costly operations weigh more.
  static void step(uint64_t weight = 1);
  // Throws when a string of `bytes` or a list of `items` would exceed this thread's limits (the defaults
  // outside a render). Call before building the value when its size is known in advance.
  static void check_string(size_t bytes, const char* what);
  static void check_list(size_t items, const char* what);

 private:
  RenderLimits limits_;
  uint64_t steps_ = 0;
  RenderBudget* outer_;
};

}  // namespace lathe::jinja
