// Cross-entropy of logits x [rows, vocab] against targets t [rows]:
//
//   m      = max_j x_j
//   lse    = m + ln sum_j exp(x_j - m)
//   loss_r = (m - x_t) + ln sum_j exp(x_j - m)      (= lse - x_t)
//   loss   = (1 / rows) sum_r loss_r                 (mean, summed in row order)
//   dx_j   = (exp((x_j - m) - ln sum) - [j == t]) * grad_scale,  grad_scale = 1 / rows
//
// The forward stores each row's (m, ln sum) in `stats` [rows, 2]; the
// backward reads them instead of recomputing, so it reads the logits once:
// one pass over 600 KB rows that do not stay in cache.
//
// A target outside [0, vocab) yields NaN for that row (detectable, never a
// read out of bounds).
//
// Row kernels: one block per row (grid.x = rows to write), blockDim.x a
// multiple of 32. The mean is one block summing the row losses in a fixed
// order, so the loss is bit-for-bit reproducible.
//
// Two modules: `cross_entropy` (XENT_PART 0: the f32 and f16-gradient
// kernels and the mean, which every step runs) and `cross_entropy_bf16`
// (XENT_PART 1: the bf16 head's fused kernel, which a step computing in
// f32 never runs and which takes NVRTC several times as long).





// Adds x to a thread's running (max m, sum s of exp(. - m)): the online
// normaliser of Milakov & Gimelshein (2018). s is rescaled by exp(m_old -
// m_new) when the max grows. -inf contributes exp(-inf) = 0; a NaN lands in
// the second branch and poisons s, as it must.
__device__ __forceinline__ void online_add(float& m, float& s, float x) {
    if (x > m) {
        s = s * expf(m - x) + 1.0f;
        m = x;
    } else if (x != __int_as_float(0xff800000)) {
        s += expf(x - m);
    }
}

#if XENT_PART == 0
// (m, ln sum_j exp(x_j - m)) of one row; every thread gets both.
//
// One pass over the row: each thread keeps its own running (m_t, s_t) with
// online_add, then the block combines m = max_t m_t and
// s = sum_t s_t exp(m_t - m). A row of the full vocabulary (600 KB) does not
// stay in cache between two passes, so one pass halves the bytes read. When
// the row is 16-byte aligned the thread reads float4s (enough bytes in flight
// to cover DRAM latency); the last vocab % 4 values are read one by one.
__device__ float2 row_shifted_lse(const float* xr, int vocab) {
    float m = __int_as_float(0xff800000);
    float s = 0.0f;
    int done = 0;
    if (aligned16(xr)) {
        const int v4 = vocab / 4;
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        for (int j = threadIdx.x; j < v4; j += blockDim.x) {
            const float4 x = x4[j];
            online_add(m, s, x.x);
            online_add(m, s, x.y);
            online_add(m, s, x.z);
            online_add(m, s, x.w);
        }
        done = 4 * v4;
    }
    for (int j = done + threadIdx.x; j < vocab; j += blockDim.x) online_add(m, s, xr[j]);
    const float mb = block_max(m);
    // A thread that saw only -inf (or nothing) adds 0, not 0 * exp(nan); a
    // NaN in s (a NaN logit) must reach the sum, so the test is s == 0.
    float t = s == 0.0f ? 0.0f : s * expf(m - mb);
    t = block_sum(t);
    return make_float2(mb, logf(t));
}

// losses[r] = loss_r and stats[r] = (m, ln sum) for rows [0, rows).
extern "C" __global__ void cross_entropy_fwd_f32(const float* __restrict__ logits,
                                                 const unsigned int* __restrict__ targets,
                                                 float* __restrict__ losses,
                                                 float2* __restrict__ stats,
                                                 int rows, int vocab) {
    const int row = blockIdx.x;
    if (row >= rows) return;  // uniform per block
    const float* xr = logits + (size_t)row * vocab;
    const float2 ml = row_shifted_lse(xr, vocab);
    if (threadIdx.x == 0) {
        const unsigned int t = targets[row];
        losses[row] = t < (unsigned int)vocab ? (ml.x - xr[t]) + ml.y : __int_as_float(0x7fc00000);
        stats[row] = ml;
    }
}

// out[0] = (1 / rows) * sum_{r < rows} losses[r]. One block; thread k sums
// rows k, k + blockDim.x, ... in order, then a fixed-shape tree.
extern "C" __global__ void cross_entropy_mean_f32(const float* __restrict__ losses,
                                                  float* __restrict__ out,
                                                  int rows) {
    if (blockIdx.x != 0) return;
    float acc = 0.0f;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) acc += losses[r];
    const float total = block_sum(acc);
    if (threadIdx.x == 0) out[0] = total / (float)rows;
}

// dlogits for rows [0, rows): (softmax(x_r) - onehot(t_r)) * grad_scale,
// with the forward's stats of each row, stored as S stores it (f32, or f16
// bits rounded to nearest even: common.cuh's store policies).
template <typename S>
__device__ __forceinline__ void cross_entropy_bwd(const float* __restrict__ logits,
                                                  const unsigned int* __restrict__ targets,
                                                  const float2* __restrict__ stats,
                                                  typename S::T* __restrict__ dlogits,
                                                  int rows, int vocab, float grad_scale) {
    const int row = blockIdx.x;
    if (row >= rows) return;
    const size_t base = (size_t)row * vocab;
    const float* xr = logits + base;
    const float2 ml = stats[row];
    const unsigned int t = targets[row];
    const float bad = t < (unsigned int)vocab ? 0.0f : __int_as_float(0x7fc00000);
    typename S::T* dr = dlogits + base;
    // (softmax - onehot) * grad_scale of element j with logit x.
    auto grad = [&](int j, float x) {
        const float p = expf((x - ml.x) - ml.y);
        const float onehot = (unsigned int)j == t ? 1.0f : 0.0f;
        return (p - onehot) * grad_scale + bad;
    };
    int done = 0;
    if (aligned16(xr) && S::vec(dr)) {
        const int v4 = vocab / 4;
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        for (int j = threadIdx.x; j < v4; j += blockDim.x) {
            const float4 x = x4[j];
            const int e = 4 * j;
            S::put4(dr, j, grad(e, x.x), grad(e + 1, x.y), grad(e + 2, x.z), grad(e + 3, x.w));
        }
        done = 4 * v4;
    }
    for (int j = done + threadIdx.x; j < vocab; j += blockDim.x) S::put(dr, j, grad(j, xr[j]));
}

extern "C" __global__ void cross_entropy_bwd_f32(const float* __restrict__ logits,
                                                 const unsigned int* __restrict__ targets,
                                                 const float2* __restrict__ stats,
                                                 float* __restrict__ dlogits,
                                                 int rows, int vocab, float grad_scale) {
    cross_entropy_bwd<StoreF32>(logits, targets, stats, dlogits, rows, vocab, grad_scale);
}

// As cross_entropy_bwd_f32, the gradients stored in f16 (raw bits): for the
// LM head's f16 GEMM, with a grad_scale that keeps them in f16's normal range.
extern "C" __global__ void cross_entropy_bwd_f16(const float* __restrict__ logits,
                                                 const unsigned int* __restrict__ targets,
                                                 const float2* __restrict__ stats,
                                                 unsigned short* __restrict__ dlogits,
                                                 int rows, int vocab, float grad_scale) {
    cross_entropy_bwd<StoreF16>(logits, targets, stats, dlogits, rows, vocab, grad_scale);
}

#else  // XENT_PART 1

// The bf16 LM head's cross-entropy, forward and backward in one kernel, in
// place: row r of x holds the row's logits in bf16 (raw bits) on entry and
// (softmax(x_r) - onehot(t_r)) * grad_scale in bf16 on return, and
// losses[r] = lse(x_r) - x_r[t_r] (f32 arithmetic on the exact values of the
// bf16 logits). One pass computes the row's (m, ln sum) online; a second
// rewrites it. Every logit is read before any is written: the target logit
// by thread 0 before the reductions, whose barriers order it before the
// second pass. A row of the full vocabulary is 300 KB in bf16.
//
// The first pass keeps what it read on chip for the second: a thread's
// first CE_REG_ITEMS 16-byte items in registers, the next `kept_items` in
// shared memory (`kept_items * blockDim.x` items, the launcher's dynamic
// shared memory), and the second pass reads again from memory only what
// exceeds both: a chunk's logits are more than L2 holds (156 MB at
// qwen2.5-0.5b's chunk of 512 rows), so a second read would come from DRAM.
// The arithmetic is one exp2 a logit in each pass; the kernel is bound by
// its bytes, not by a longer exp.
//
// The rows of one launch may be a chunk of the step's rows; grad_scale is
// 1 / (the step's rows) all the same, the gradient of the step's mean loss.
// No __restrict__ on x: it is read and written.
#define CE_REG_ITEMS 8

#define CE_LOG2E 1.4426950408889634f

// The eight logits of item q (raw bf16 bits), in column order.
__device__ __forceinline__ void unpack_item(uint4 q, float v[8]) {
    const unsigned int w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[2 * i] = __uint_as_float(w[i] << 16);
        v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

// Two floats rounded to bf16 and packed, lo in the low half: one
// instruction from sm_80 on.
__device__ __forceinline__ unsigned int pack_bf16x2(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
    unsigned int d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
#else
    return (unsigned int)f32_to_bf16_bits(lo) | ((unsigned int)f32_to_bf16_bits(hi) << 16);
#endif
}

// Adds the eight logits of item q to a thread's running (max m, sum s of
// exp(. - m)): the max moves once an item, and each logit costs one exp2
// (`exp2f`, within 2 ulp; `(x - m)` is exact for bf16 values). While m is
// still -inf every logit so far is -inf or NaN: taken against 0 instead,
// -inf adds 0 and a NaN poisons s, as it must.
__device__ __forceinline__ void online_add_item(float& m, float& s, uint4 q) {
    float v[8];
    unpack_item(q, v);
    float top = v[0];
#pragma unroll
    for (int k = 1; k < 8; ++k) top = fmaxf(top, v[k]);
    if (top > m) {
        s *= exp2f((m - top) * CE_LOG2E);
        m = top;
    }
    const float base = m == __int_as_float(0xff800000) ? 0.0f : m;
#pragma unroll
    for (int k = 0; k < 8; ++k) s += exp2f((v[k] - base) * CE_LOG2E);
}

// The gradients of the eight logits of item q, the first at column e:
// (exp((x - m) - ln sum) - [j == t]) * grad_scale + bad, in bf16.
__device__ __forceinline__ uint4 grad_item(uint4 q, int e, float2 ml, unsigned int t,
                                           float grad_scale, float bad) {
    float v[8];
    unpack_item(q, v);
    float g[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) g[k] = exp2f(((v[k] - ml.x) - ml.y) * CE_LOG2E);
    if (t - (unsigned int)e < 8u) {
#pragma unroll
        for (int k = 0; k < 8; ++k)
            if ((unsigned int)(e + k) == t) g[k] -= 1.0f;
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) g[k] = g[k] * grad_scale + bad;
    return make_uint4(pack_bf16x2(g[0], g[1]), pack_bf16x2(g[2], g[3]),
                      pack_bf16x2(g[4], g[5]), pack_bf16x2(g[6], g[7]));
}

extern "C" __global__ void __launch_bounds__(1024, 1)
    cross_entropy_fused_bf16(unsigned short* x, const unsigned int* __restrict__ targets,
                             float* __restrict__ losses, int rows, int vocab, float grad_scale,
                             int kept_items) {
    extern __shared__ uint4 kept[];  // [kept_items][blockDim.x]
    const int row = blockIdx.x;
    if (row >= rows) return;  // uniform per block
    unsigned short* xr = x + (size_t)row * vocab;
    const unsigned int t = targets[row];
    const bool valid = t < (unsigned int)vocab;
    const float xt = (threadIdx.x == 0 && valid) ? bf16_bits_to_f32(xr[t]) : 0.0f;
    // Eight logits (16 bytes) a load where the row is aligned for it; item
    // k of a thread is x8[threadIdx.x + k * blockDim.x], in the order the
    // online sums take them.
    const bool vec = aligned16(xr);
    const int v8 = vec ? vocab / 8 : 0;
    uint4* x8 = reinterpret_cast<uint4*>(xr);
    const int step = blockDim.x;
    const int first_kept = threadIdx.x + CE_REG_ITEMS * step;
    float m = __int_as_float(0xff800000);
    float s = 0.0f;
    // The register items' loads all go out before the first sum needs one.
    uint4 reg[CE_REG_ITEMS];
#pragma unroll
    for (int k = 0; k < CE_REG_ITEMS; ++k) {
        const int j = threadIdx.x + k * step;
        if (j < v8) reg[k] = x8[j];
    }
#pragma unroll
    for (int k = 0; k < CE_REG_ITEMS; ++k)
        if (threadIdx.x + k * step < v8) online_add_item(m, s, reg[k]);
#pragma unroll 4
    for (int j = first_kept, k = 0; j < v8; j += step, ++k) {
        const uint4 q = x8[j];
        online_add_item(m, s, q);
        if (k < kept_items) kept[k * step + threadIdx.x] = q;
    }
    for (int j = 8 * v8 + threadIdx.x; j < vocab; j += blockDim.x)
        online_add(m, s, bf16_bits_to_f32(xr[j]));
    const float mb = block_max(m);
    float part = s == 0.0f ? 0.0f : s * expf(m - mb);
    const float2 ml = make_float2(mb, logf(block_sum(part)));
    if (threadIdx.x == 0)
        losses[row] = valid ? (ml.x - xt) + ml.y : __int_as_float(0x7fc00000);
    const float bad = valid ? 0.0f : __int_as_float(0x7fc00000);
#pragma unroll
    for (int k = 0; k < CE_REG_ITEMS; ++k) {
        const int j = threadIdx.x + k * step;
        if (j < v8) x8[j] = grad_item(reg[k], 8 * j, ml, t, grad_scale, bad);
    }
#pragma unroll 4
    for (int j = first_kept, k = 0; j < v8; j += step, ++k) {
        const uint4 q = k < kept_items ? kept[k * step + threadIdx.x] : x8[j];
        x8[j] = grad_item(q, 8 * j, ml, t, grad_scale, bad);
    }
    for (int j = 8 * v8 + threadIdx.x; j < vocab; j += blockDim.x) {
        const float g = (expf((bf16_bits_to_f32(xr[j]) - ml.x) - ml.y) -
                         ((unsigned int)j == t ? 1.0f : 0.0f)) * grad_scale + bad;
        xr[j] = f32_to_bf16_bits(g);
    }
}
#endif
