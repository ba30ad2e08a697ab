// Cross-entropy of logits x [rows, vocab] against targets t [rows]:
//
//   m      = max_j x_j
//   lse    = m + ln sum_j exp(x_j - m)
//   loss_r = (m - x_t) + ln sum_j exp(x_j - m)      (= lse - x_t)
//   loss   = (1 / rows) sum_r loss_r                 (mean, summed in row order)
//   dx_j   = (exp((x_j - m) - ln sum) - [j == t]) * grad_scale,  grad_scale = 1 / rows
//
// A target outside [0, vocab) yields NaN for that row (detectable, never a
// read out of bounds).
//
// Row kernels: one block per row (grid.x = rows to write), blockDim.x a
// multiple of 32. The mean is one block summing the row losses in a fixed
// order, so the loss is bit-for-bit reproducible.

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum of v over the block (blockDim.x a multiple of 32); every thread gets it.
__device__ float block_sum(float v) {
    __shared__ float partial[32];
    __shared__ float total;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = lane < nwarps ? partial[lane] : 0.0f;
        s = warp_sum(s);
        if (lane == 0) total = s;
    }
    __syncthreads();
    const float out = total;
    __syncthreads();  // `partial` and `total` may be reused by the next call
    return out;
}

// Maximum of v over the block; every thread gets it.
__device__ float block_max(float v) {
    __shared__ float partial[32];
    __shared__ float total;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = lane < nwarps ? partial[lane] : __int_as_float(0xff800000);
        s = warp_max(s);
        if (lane == 0) total = s;
    }
    __syncthreads();
    const float out = total;
    __syncthreads();
    return out;
}

// (m, ln sum_j exp(x_j - m)) of one row; every thread gets both.
//
// One pass over the row (the online normaliser of Milakov & Gimelshein,
// 2018): each thread keeps its running max m_t and s_t = sum exp(x - m_t),
// rescaling s_t by exp(m_old - m_new) when its max grows; the block then
// combines m = max_t m_t and s = sum_t s_t exp(m_t - m). A row of the full
// vocabulary (600 KB) does not stay in cache between two passes, so this
// halves the bytes read. Elements equal to -inf contribute exp(-inf) = 0;
// a NaN element makes the row's result NaN.
__device__ float2 row_shifted_lse(const float* xr, int vocab) {
    const float ninf = __int_as_float(0xff800000);
    float m = ninf;
    float s = 0.0f;
    #pragma unroll 4
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
        const float x = xr[j];
        if (x > m) {
            s = s * expf(m - x) + 1.0f;
            m = x;
        } else if (x != ninf) {
            // NaN lands here too and poisons s, as it must.
            s += expf(x - m);
        }
    }
    const float mb = block_max(m);
    // A thread that saw only -inf (or nothing) adds 0, not 0 * exp(nan).
    float t = s > 0.0f ? s * expf(m - mb) : 0.0f;
    t = block_sum(t);
    return make_float2(mb, logf(t));
}

// losses[r] = loss_r for rows [0, rows).
extern "C" __global__ void cross_entropy_fwd_f32(const float* __restrict__ logits,
                                                 const unsigned int* __restrict__ targets,
                                                 float* __restrict__ losses,
                                                 int rows, int vocab) {
    const int row = blockIdx.x;
    if (row >= rows) return;  // uniform per block
    const float* xr = logits + (size_t)row * vocab;
    const float2 ml = row_shifted_lse(xr, vocab);
    if (threadIdx.x == 0) {
        const unsigned int t = targets[row];
        losses[row] = t < (unsigned int)vocab ? (ml.x - xr[t]) + ml.y : __int_as_float(0x7fc00000);
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

// dlogits for rows [0, rows): (softmax(x_r) - onehot(t_r)) * grad_scale.
extern "C" __global__ void cross_entropy_bwd_f32(const float* __restrict__ logits,
                                                 const unsigned int* __restrict__ targets,
                                                 float* __restrict__ dlogits,
                                                 int rows, int vocab, float grad_scale) {
    const int row = blockIdx.x;
    if (row >= rows) return;
    const size_t base = (size_t)row * vocab;
    const float* xr = logits + base;
    const float2 ml = row_shifted_lse(xr, vocab);
    const unsigned int t = targets[row];
    const float bad = t < (unsigned int)vocab ? 0.0f : __int_as_float(0x7fc00000);
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
        const float p = expf((xr[j] - ml.x) - ml.y);
        const float onehot = (unsigned int)j == t ? 1.0f : 0.0f;
        dlogits[base + j] = (p - onehot) * grad_scale + bad;
    }
}
