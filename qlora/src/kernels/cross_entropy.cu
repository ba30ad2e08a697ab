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

// The bf16 LM head's cross-entropy, forward and backward in one kernel, in
// place: row r of x holds the row's logits in bf16 (raw bits) on entry and
// (softmax(x_r) - onehot(t_r)) * grad_scale in bf16 on return, and
// losses[r] = lse(x_r) - x_r[t_r] (f32 arithmetic on the exact values of the
// bf16 logits). One pass computes the row's (m, ln sum) online; a second
// rewrites it. Every logit is read before any is written: the target logit
// by thread 0 before the reductions, whose barriers order it before the
// second pass. A row of the full vocabulary is 300 KB in bf16.
//
// The rows of one launch may be a chunk of the step's rows; grad_scale is
// 1 / (the step's rows) all the same, the gradient of the step's mean loss.
// No __restrict__ on x: it is read and written.
__device__ __forceinline__ void online_add_bf16x2(float& m, float& s, unsigned int two) {
    online_add(m, s, __uint_as_float(two << 16));
    online_add(m, s, __uint_as_float(two & 0xffff0000u));
}

__device__ __forceinline__ unsigned int grad_pair(unsigned int two, int j, float2 ml,
                                                  unsigned int t, float grad_scale, float bad) {
    const float x0 = __uint_as_float(two << 16);
    const float x1 = __uint_as_float(two & 0xffff0000u);
    const float g0 = (expf((x0 - ml.x) - ml.y) - ((unsigned int)j == t ? 1.0f : 0.0f)) * grad_scale + bad;
    const float g1 = (expf((x1 - ml.x) - ml.y) - ((unsigned int)(j + 1) == t ? 1.0f : 0.0f)) * grad_scale + bad;
    return (unsigned int)f32_to_bf16_bits(g0) | ((unsigned int)f32_to_bf16_bits(g1) << 16);
}

extern "C" __global__ void cross_entropy_fused_bf16(unsigned short* x,
                                                    const unsigned int* __restrict__ targets,
                                                    float* __restrict__ losses, int rows,
                                                    int vocab, float grad_scale) {
    const int row = blockIdx.x;
    if (row >= rows) return;  // uniform per block
    unsigned short* xr = x + (size_t)row * vocab;
    const unsigned int t = targets[row];
    const bool valid = t < (unsigned int)vocab;
    const float xt = (threadIdx.x == 0 && valid) ? bf16_bits_to_f32(xr[t]) : 0.0f;
    // Eight logits (16 bytes) a load where the row is aligned for it.
    const bool vec = aligned16(xr);
    const int v8 = vec ? vocab / 8 : 0;
    uint4* x8 = reinterpret_cast<uint4*>(xr);
    float m = __int_as_float(0xff800000);
    float s = 0.0f;
    for (int j = threadIdx.x; j < v8; j += blockDim.x) {
        const uint4 q = x8[j];
        online_add_bf16x2(m, s, q.x);
        online_add_bf16x2(m, s, q.y);
        online_add_bf16x2(m, s, q.z);
        online_add_bf16x2(m, s, q.w);
    }
    for (int j = 8 * v8 + threadIdx.x; j < vocab; j += blockDim.x)
        online_add(m, s, bf16_bits_to_f32(xr[j]));
    const float mb = block_max(m);
    float part = s == 0.0f ? 0.0f : s * expf(m - mb);
    const float2 ml = make_float2(mb, logf(block_sum(part)));
    if (threadIdx.x == 0)
        losses[row] = valid ? (ml.x - xt) + ml.y : __int_as_float(0x7fc00000);
    const float bad = valid ? 0.0f : __int_as_float(0x7fc00000);
    for (int j = threadIdx.x; j < v8; j += blockDim.x) {
        const uint4 q = x8[j];
        const int e = 8 * j;
        x8[j] = make_uint4(grad_pair(q.x, e, ml, t, grad_scale, bad),
                           grad_pair(q.y, e + 2, ml, t, grad_scale, bad),
                           grad_pair(q.z, e + 4, ml, t, grad_scale, bad),
                           grad_pair(q.w, e + 6, ml, t, grad_scale, bad));
    }
    for (int j = 8 * v8 + threadIdx.x; j < vocab; j += blockDim.x) {
        const float g = (expf((bf16_bits_to_f32(xr[j]) - ml.x) - ml.y) -
                         ((unsigned int)j == t ? 1.0f : 0.0f)) * grad_scale + bad;
        xr[j] = f32_to_bf16_bits(g);
    }
}
