// A fixed pool of worker threads for data-parallel kernels. parallel_for splits [0, n) into contiguous
// chunks, runs them on the workers and the caller, and returns when all are done.
#pragma once
#include <cstdint>
#include <functional>

namespace lathe {

int num_threads();
void set_num_threads(int n);  // takes effect before the first parallel_for

// fn(begin, end) is called on disjoint ranges covering [0, n). Ranges are multiples of `grain` except the last.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace lathe
