// Launchers of the CUDA kernels, over raw device pointers (so this library needs no Tensor). ops_cuda.cc in
// lathe_core checks shapes and calls these. Activations and dense weights are F32 or BF16 (`DType`); every
// kernel accumulates in f32. All work is queued on cuda::stream().
#pragma once
#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"
#include "tensor/logit_edit.h"
#include "tensor/lora_site_desc.h"
#include "tensor/row_sampling.h"

namespace lathe::cuda {

// An MLX affine-quantized matrix [rows, cols] on the device (see QuantizedMatrix in ops.h).
struct QuantView {
  const uint32_t* w = nullptr;
  const void* scales = nullptr;  // bf16 when sb_bf16, else f32; [rows, cols / group_size]
  const void* biases = nullptr;
  bool sb_bf16 = true;
  int bits = 4, group_size = 64;
  int64_t rows = 0, cols = 0;
  int64_t w_stride = 0, sb_stride = 0;  // row strides in words / elements
};

// y[N] = W·x (+ bias) for one row x[K]; weights read once, dequantized in registers.
void gemv_quantized(const QuantView& q, const void* x, DType xt, void* y, DType yt, const float* bias);
// The GEMV over x [tokens, K] into y [tokens, N], each token's row exactly what gemv_quantized gives it alone;
// false (nothing launched) where the tensor-core GEMV does not cover the case (then dequantize + GEMM).
bool gemv_quantized_rows(const QuantView& q, const void* x, DType xt, int64_t tokens, void* y, DType yt,
                         const float* bias);
// Rows [row0, row0 + n) as dense [n, cols] of type ot (F32 or BF16).
void dequantize(const QuantView& q, int64_t row0, int64_t n, void* out, DType ot);
// y[M, N] = x[M, K] · w[N, K]ᵀ through cuBLAS; x and w share a type (F32 or BF16), y is F32 or BF16.
void gemm(const void* x, const void* w, DType t, int64_t M, int64_t N, int64_t K, void* y, DType yt);
void add_bias(void* y, DType t, int64_t M, int64_t N, const float* bias);

void embedding_dense(const void* table, DType tt, int64_t dim, const int32_t* ids, int64_t n, void* out, DType ot);
void embedding_quantized(const QuantView& q, const int32_t* ids, int64_t n, void* out, DType ot);

void rms_norm(const void* x, DType xt, void* out, DType ot, int64_t rows, int64_t dim, const float* w, float eps,
              bool plus_one);
// x [T, H, D] contiguous, in place; inv_freq is a host array of dims/2 entries.
void rope(void* x, DType t, int64_t T, int64_t H, int64_t D, const float* inv_freq, int dims, float scaling,
          int64_t pos0);  // position pos0 + t + *step_delta()

enum class Gate { SiLU, GeluTanh };
void gated(const void* gate, const void* up, void* out, DType t, int64_t n, Gate g);
// rows × width: gate and up rows `stride` elements apart (the two halves of a fused gate|up matmul's output).
void gated_rows(const void* gate, const void* up, void* out, DType t, int64_t rows, int64_t width, int64_t stride,
                Gate g);
void add_inplace(void* a, DType at, const void* b, DType bt, int64_t n);
void scale_inplace(void* x, DType t, int64_t n, float s);
void softcap_inplace(void* x, DType t, int64_t n, float cap);
void convert(const void* in, DType it, void* out, DType ot, int64_t n);
// Index of each row's maximum (first on ties) into out[rows] (device).
void argmax_rows(const void* x, DType t, int64_t rows, int64_t cols, int32_t* out);
// x[e.index] = apply_logit_edit(x[e.index], e) for n edits (device array, distinct indices) over f32 x.
void apply_logit_edits(float* x, const LogitEdit* edits, int64_t n);
// Rows rows[0..n) of f32 x [*, cols]: a token whose bit in bits[k · ⌈cols/64⌉ ..] is clear becomes -inf (device
// arrays).
void apply_token_masks(float* x, int64_t cols, const int32_t* rows, int64_t n, const uint64_t* bits);
// Each row of f32 x [rows, cols] sampled by its params[row] (device array) as the host Sampler samples: the
// token into tokens[row], its log-probability into logprobs[row] (device arrays).
void sample_rows(const float* x, int64_t rows, int64_t cols, const RowSampling* params, int32_t* tokens,
                 float* logprobs);

// Host → device copy ordered on the stream through pinned staging: returns at once, src free to reuse (the
// engine thread is the only caller). runtime.cc.
void upload_async(void* dst, const void* src, size_t bytes);
void copy_async(void* dst, const void* src, size_t bytes);  // device to device, ordered on the stream

// Decode-step graphs (graph.cc). Position-dependent kernels add *step_delta() (0 except during a replay).
constexpr int kMaxStepIds = 8;
const int64_t* step_delta();
const int32_t* step_ids();  // token ids of a captured step, written before each capture and replay
bool capturing();
struct Graph;
Graph* graph_capture(int32_t token);        // begins capturing the stream
void graph_capture_end(Graph* g, bool ok);  // ends it; instantiates when ok
void graph_launch(Graph* g, int64_t delta, int32_t token);
void graph_destroy(Graph* g);
// Batched decode graphs (model/batch_graph.h): the capture reads its n token ids at `ids` (device memory the
// caller rewrites before each replay) and, being one chain of kernels on the one stream, reuses the blocks it
// frees; graph_replay launches it as captured. graph_pool_bytes: device memory the graph holds.
Graph* graph_capture_batch(const int32_t* ids, int64_t n);
const int32_t* capture_batch_ids(int64_t n);  // the capture's ids, or null outside one (or for another n)
void graph_replay(Graph* g);
size_t graph_pool_bytes(const Graph* g);
// The tables a batched graph reads: pinned host staging and the device copy its kernels were captured with.
struct GraphArena;
GraphArena* arena_create(size_t bytes);
void arena_destroy(GraphArena* a);
char* arena_host(GraphArena* a);  // free to write: waits until the last upload has read it
char* arena_dev(GraphArena* a);
void arena_upload(GraphArena* a);  // the whole staging to the device, ordered on the stream

// Many small device-to-device copies in one launch: segs is a device array [n] (sizes and addresses multiples of 4).
struct CopySegment {
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t bytes = 0;
};
void copy_segments(const CopySegment* segs, int64_t n);

// dst rows [dst_row + *step_delta(), + n) = src rows [0, n); rows of row_bytes (a multiple of 4).
void copy_rows(void* dst, int64_t dst_row, const void* src, int64_t n, size_t row_bytes);

struct AttentionArgs {
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  void* out = nullptr;  // [T, Hq, Dv] contiguous
  DType t = DType::F32;
  int64_t T = 0, Hq = 0, D = 0, S = 0, Hkv = 0, Dv = 0;
  int64_t q_s0 = 0, q_s1 = 0, k_s0 = 0, k_s1 = 0, v_s0 = 0, v_s1 = 0;  // element strides
  float scale = 1.f, softcap = 0.f;
  int64_t window = 0;
  bool causal = true;
  int64_t q_pos0 = 0, k_pos0 = 0;
  const int64_t* k_pos = nullptr;  // device array [S] or null
  const int64_t* delta = nullptr;  // with linear positions: added to S and q_pos0 (graph replays)
  // Quantized K/V, read in place by the decode kernel (decode_attention.cu) only: kv_bits 4 or 8 makes k and v
  // the MLX codes, their strides above counted in values; each group of k_gs / v_gs values of a row has one
  // bf16 scale and bias, strides in groups.
  int kv_bits = 0;
  const void *k_scales = nullptr, *k_biases = nullptr, *v_scales = nullptr, *v_biases = nullptr;
  int64_t k_gs = 0, v_gs = 0, ksb_s0 = 0, ksb_s1 = 0, vsb_s0 = 0, vsb_s1 = 0;
};
void attention(const AttentionArgs& a);
// The tensor-core prefill path (BF16, head dims 64/128/256, linear key positions); false when it does not apply.
bool attention_flash(const AttentionArgs& a);

// LoRA residuals of a group of sites (lora_residual.cu), in two launches so that the base matmul can run
// between them: token t reads the site descriptors per_token[t] (null = no adapter), or `uniform` for every
// token when per_token is null. lora_shrink: u [tokens, g.n, rmax] = scale · (x · Aᵀ) with x [tokens, ldx]
// holding `in` values a row in xt (= the factors' type), rmax at least every rank read. lora_expand: y [tokens,
// ldy] += u · Bᵀ into each site's columns.
// lora_shrink returns true when it forked onto a second stream (while a graph is captured); the matching
// lora_expand must then be told (forked) so that it joins that stream first.
bool lora_shrink(DType xt, const void* x, int64_t ldx, int64_t tokens, int64_t in, const LoraSiteDesc* uniform,
                 const LoraSiteDesc* const* per_token, const LoraGroup& g, int rmax, float* u);
void lora_expand(DType ft, DType yt, void* y, int64_t ldy, int64_t tokens, const LoraSiteDesc* uniform,
                 const LoraSiteDesc* const* per_token, const LoraGroup& g, int rmax, const float* u, bool forked);

}  // namespace lathe::cuda
