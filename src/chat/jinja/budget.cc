#include "chat/jinja/budget.h"

#include <string>

#include "common/error.h"
#include "common/limits.h"

namespace lathe::jinja {
namespace {

thread_local RenderBudget* t_budget = nullptr;

[[noreturn]] void exceeded(const std::string& message) {
  throw Error(ErrorKind::InvalidArgument, "template exceeds its render budget: " + message);
}

}  // namespace

RenderLimits default_render_limits() {
  return {limits::kJinjaMaxSteps, limits::kJinjaMaxOutputBytes, limits::kJinjaMaxListItems, nullptr};
}

RenderBudget::RenderBudget(const RenderLimits& limits) : limits_(limits), outer_(t_budget) { t_budget = this; }

RenderBudget::~RenderBudget() { t_budget = outer_; }

void RenderBudget::step(uint64_t weight) {
  RenderBudget* b = t_budget;
  if (!b) return;
  const uint64_t before = b->steps_;
  b->steps_ += weight;
  if (b->steps_ > b->limits_.max_steps)
    exceeded("more than " + std::to_string(b->limits_.max_steps) + " evaluation steps");
  // The flag is shared with other threads; reading it every 1024 steps keeps the check off the hot path.
  if ((before >> 10) != (b->steps_ >> 10) && b->limits_.cancel && b->limits_.cancel->load(std::memory_order_relaxed))
    throw Error(ErrorKind::InvalidArgument, "template rendering was cancelled");
}

void RenderBudget::check_string(size_t bytes, const char* what) {
  const size_t limit = t_budget ? t_budget->limits_.max_string_bytes : limits::kJinjaMaxOutputBytes;
  if (bytes > limit)
    exceeded(std::string(what) + " would be " + std::to_string(bytes) + " bytes (the limit is " +
             std::to_string(limit) + ")");
}

void RenderBudget::check_list(size_t items, const char* what) {
  const size_t limit = t_budget ? t_budget->limits_.max_list_items : limits::kJinjaMaxListItems;
  if (items > limit)
    exceeded(std::string(what) + " would have " + std::to_string(items) + " items (the limit is " +
             std::to_string(limit) + ")");
}

}  // namespace lathe::jinja
