// Decode-step CUDA graphs: capture on the one stream, instantiate, replay. Kernels whose arguments depend on
// the token position (RoPE, attention, the KV-cache append) add a device-side delta, 0 except while a step
// captured at position p is replayed at position p + delta; the step's token ids are read from a fixed device
// buffer. Blocks freed during a capture stay with the graph until it is destroyed, so nothing else can take
// memory that a replay writes.
#include <cstring>
#include <vector>

#include "common/error.h"
#include "tensor/cuda/allocator.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/runtime.h"

namespace lathe::cuda {

struct Graph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::vector<Block> pool;
};

namespace {
struct StepState {
  int64_t delta = 0;
  int32_t ids[kMaxStepIds] = {};
};
StepState* device_state() {
  static StepState* d = [] {
    void* p = nullptr;
    LATHE_CUDA_ALLOC_CHECK(cudaMalloc(&p, sizeof(StepState)), "device", sizeof(StepState));
    LATHE_CUDA_CHECK(cudaMemset(p, 0, sizeof(StepState)));
    return static_cast<StepState*>(p);
  }();
  return d;
}
// Pinned staging, so the copies stay asynchronous: [0] the next replay's state, [1] all zeros, copied back
// after each replay so that kernels outside graphs see delta 0.
StepState* host_state() {
  static StepState* h = [] {
    void* p = nullptr;
    LATHE_CUDA_ALLOC_CHECK(cudaMallocHost(&p, 2 * sizeof(StepState)), "pinned host", 2 * sizeof(StepState));
    std::memset(p, 0, 2 * sizeof(StepState));
    return static_cast<StepState*>(p);
  }();
  return h;
}
bool g_capturing = false;
const int32_t* g_batch_ids = nullptr;  // graph_capture_batch: the ids the capture reads
int64_t g_batch_n = 0;

void write_state(int64_t delta, int32_t token) {
  // The previous step ended with a synchronising read-back, so the pinned staging is free to overwrite.
  StepState* h = host_state();
  h->delta = delta;
  h->ids[0] = token;
  LATHE_CUDA_CHECK(cudaMemcpyAsync(device_state(), h, sizeof(StepState), cudaMemcpyHostToDevice, stream()));
}
}  // namespace

const int64_t* step_delta() { return &device_state()->delta; }
const int32_t* step_ids() { return device_state()->ids; }
bool capturing() { return g_capturing; }

namespace {
// Starts capturing the stream, holding capture_mutex() until graph_capture_end.
Graph* begin_capture(bool reuse) {
  capture_mutex().lock();
  try {
    LATHE_CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeRelaxed));
  } catch (...) {
    capture_mutex().unlock();
    throw;
  }
  allocator_capture_begin(reuse);
  g_capturing = true;
  return new Graph();
}
}  // namespace

Graph* graph_capture(int32_t token) {
  write_state(0, token);
  return begin_capture(/*reuse=*/false);
}

Graph* graph_capture_batch(const int32_t* ids, int64_t n) {
  Graph* g = begin_capture(/*reuse=*/true);
  g_batch_ids = ids;
  g_batch_n = n;
  return g;
}

const int32_t* capture_batch_ids(int64_t n) { return g_capturing && n == g_batch_n ? g_batch_ids : nullptr; }

void graph_replay(Graph* g) { LATHE_CUDA_CHECK(cudaGraphLaunch(g->exec, stream())); }

size_t graph_pool_bytes(const Graph* g) {
  size_t n = 0;
  for (const Block& b : g->pool) n += b.size;
  return n;
}

struct GraphArena {
  char* host = nullptr;
  char* dev = nullptr;
  size_t bytes = 0;
  cudaEvent_t read = nullptr;  // recorded after each upload
  bool pending = false;
};

GraphArena* arena_create(size_t bytes) {
  auto* a = new GraphArena();
  a->bytes = bytes;
  try {
    LATHE_CUDA_ALLOC_CHECK(cudaMallocHost(reinterpret_cast<void**>(&a->host), bytes), "pinned host", bytes);
    std::memset(a->host, 0, bytes);
    LATHE_CUDA_ALLOC_CHECK(cudaMalloc(reinterpret_cast<void**>(&a->dev), bytes), "device", bytes);
    LATHE_CUDA_CHECK(cudaEventCreateWithFlags(&a->read, cudaEventDisableTiming));
  } catch (...) {
    arena_destroy(a);
    throw;
  }
  return a;
}

void arena_destroy(GraphArena* a) {
  if (!a) return;
  cudaStreamSynchronize(stream());  // a replay in flight may still read the tables
  if (a->read) cudaEventDestroy(a->read);
  if (a->dev) cudaFree(a->dev);
  if (a->host) cudaFreeHost(a->host);
  delete a;
}

char* arena_host(GraphArena* a) {
  if (a->pending) {
    LATHE_CUDA_CHECK(cudaEventSynchronize(a->read));
    a->pending = false;
  }
  return a->host;
}

char* arena_dev(GraphArena* a) { return a->dev; }

void arena_upload(GraphArena* a) {
  LATHE_CUDA_CHECK(cudaMemcpyAsync(a->dev, a->host, a->bytes, cudaMemcpyHostToDevice, stream()));
  LATHE_CUDA_CHECK(cudaEventRecord(a->read, stream()));
  a->pending = true;
}

void graph_capture_end(Graph* g, bool ok) {
  struct Release {
    ~Release() { capture_mutex().unlock(); }
  } release;
  g_capturing = false;
  g_batch_ids = nullptr;
  g_batch_n = 0;
  g->pool = allocator_capture_end();
  const cudaError_t e = cudaStreamEndCapture(stream(), &g->graph);
  if (!ok) return;
  check(e, "cudaStreamEndCapture");
  LATHE_CUDA_CHECK(cudaGraphInstantiate(&g->exec, g->graph, 0));
}

void graph_launch(Graph* g, int64_t delta, int32_t token) {
  write_state(delta, token);
  LATHE_CUDA_CHECK(cudaGraphLaunch(g->exec, stream()));
  LATHE_CUDA_CHECK(cudaMemcpyAsync(&device_state()->delta, &host_state()[1].delta, sizeof(int64_t),
                                   cudaMemcpyHostToDevice, stream()));
}

void graph_destroy(Graph* g) {
  if (!g) return;
  if (g->exec) cudaGraphExecDestroy(g->exec);
  if (g->graph) cudaGraphDestroy(g->graph);
  cudaStreamSynchronize(stream());  // a replay in flight may still use the pooled blocks
  allocator_release(g->pool);
  delete g;
}

}  // namespace lathe::cuda
