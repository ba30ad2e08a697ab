// Causal softmax, row-major x [rows, seq]. Row r is query position q = r % seq
// and sees columns j <= q:
//
//   m   = max_{k<=q} x_k                    (0 when subtract_max == 0)
//   y_j = exp(x_j - m) / sum_{k<=q} exp(x_k - m)   for j <= q
//   y_j = 0 exactly                                 for j >  q
//
//   backward (from the output y): dx_j = y_j * (dy_j - <y, dy>) over j <= q, 0 above.
//
// `subtract_max == 0` exists only for the test-only fault "softmax without max
// subtraction": without it exp overflows to inf for logits above ~88.
//
// One block per row (grid.x = rows to write), blockDim.x a multiple of 32.

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

extern "C" __global__ void softmax_fwd_f32(const float* __restrict__ x,
                                           float* __restrict__ y,
                                           int rows, int seq, int subtract_max) {
    const int row = blockIdx.x;
    if (row >= rows) return;  // uniform per block
    const size_t base = (size_t)row * seq;
    const int visible = row % seq + 1;
    float m = __int_as_float(0xff800000);
    for (int j = threadIdx.x; j < visible; j += blockDim.x) m = fmaxf(m, x[base + j]);
    m = block_max(m);
    if (!subtract_max) m = 0.0f;
    float s = 0.0f;
    for (int j = threadIdx.x; j < visible; j += blockDim.x) s += expf(x[base + j] - m);
    s = block_sum(s);
    const float inv = 1.0f / s;
    for (int j = threadIdx.x; j < seq; j += blockDim.x) {
        y[base + j] = j < visible ? expf(x[base + j] - m) * inv : 0.0f;
    }
}

extern "C" __global__ void softmax_bwd_f32(const float* __restrict__ y,
                                           const float* __restrict__ dy,
                                           float* __restrict__ dx,
                                           int rows, int seq) {
    const int row = blockIdx.x;
    if (row >= rows) return;
    const size_t base = (size_t)row * seq;
    const int visible = row % seq + 1;
    float dot = 0.0f;
    for (int j = threadIdx.x; j < visible; j += blockDim.x) dot += y[base + j] * dy[base + j];
    dot = block_sum(dot);
    for (int j = threadIdx.x; j < seq; j += blockDim.x) {
        dx[base + j] = j < visible ? y[base + j] * (dy[base + j] - dot) : 0.0f;
    }
}
