// RMSNorm over the last dimension, row-major x [rows, hidden], gamma [hidden].
//
//   forward:  r = 1 / sqrt(mean_i(x_i^2) + eps),  y_i = x_i * r * gamma_i
//   backward: u_i = dy_i * gamma_i
//             dx_i = r * u_i - x_i * r^3 * <u, x> / hidden
//             dgamma_i = sum_rows dy_i * x_i * r
//
// Row kernels: one block per row (grid.x = rows to write), any blockDim.x that
// is a multiple of 32 and <= 1024; threads stride over the row, so loads are
// coalesced, and the row reduction is a warp shuffle then one warp over the
// per-warp partials.
//
// dgamma is reduced deterministically, in a fixed order independent of
// scheduling: the dx kernel stores each row's r; a partial kernel sums, for
// each column, a fixed chunk of rows in row order; a final kernel sums the
// chunk partials in chunk order. No atomics.



// 1 / sqrt(mean(x^2) + eps) of row x[0..hidden).
__device__ float row_inv_rms(const float* x, int hidden, float eps) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) ss += x[i] * x[i];
    ss = block_sum(ss);
    return 1.0f / sqrtf(ss / (float)hidden + eps);
}

// y = rmsnorm(x) * gamma for rows [0, rows).
extern "C" __global__ void rmsnorm_fwd_f32(const float* __restrict__ x,
                                           const float* __restrict__ gamma,
                                           float* __restrict__ y,
                                           int rows, int hidden, float eps) {
    const int row = blockIdx.x;
    if (row >= rows) return;  // uniform per block
    const float* xr = x + (size_t)row * hidden;
    float* yr = y + (size_t)row * hidden;
    const float r = row_inv_rms(xr, hidden, eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) yr[i] = xr[i] * r * gamma[i];
}

// Fused residual add + RMSNorm: h = a + b (the new residual stream, stored),
// y = rmsnorm(h) * gamma. Reads a and b once instead of writing h and reading
// it back in a separate normalisation pass.
extern "C" __global__ void rmsnorm_residual_fwd_f32(const float* __restrict__ a,
                                                    const float* __restrict__ b,
                                                    const float* __restrict__ gamma,
                                                    float* __restrict__ h,
                                                    float* __restrict__ y,
                                                    int rows, int hidden, float eps) {
    const int row = blockIdx.x;
    if (row >= rows) return;
    const size_t base = (size_t)row * hidden;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float v = a[base + i] + b[base + i];
        h[base + i] = v;
        ss += v * v;
    }
    ss = block_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)hidden + eps);
    // Each thread re-reads only the h elements it wrote itself.
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) y[base + i] = h[base + i] * r * gamma[i];
}

// dx for rows [0, rows), and inv_rms[row] = r for the dgamma reduction.
extern "C" __global__ void rmsnorm_bwd_f32(const float* __restrict__ x,
                                           const float* __restrict__ gamma,
                                           const float* __restrict__ dy,
                                           float* __restrict__ dx,
                                           float* __restrict__ inv_rms,
                                           int rows, int hidden, float eps) {
    const int row = blockIdx.x;
    if (row >= rows) return;
    const size_t base = (size_t)row * hidden;
    const float* xr = x + base;
    const float* dyr = dy + base;
    float ss = 0.0f;
    float dot = 0.0f;  // <dy * gamma, x>
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float xv = xr[i];
        ss += xv * xv;
        dot += dyr[i] * gamma[i] * xv;
    }
    ss = block_sum(ss);
    dot = block_sum(dot);
    const float r = 1.0f / sqrtf(ss / (float)hidden + eps);
    const float proj = r * r * r * dot / (float)hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        dx[base + i] = r * dyr[i] * gamma[i] - xr[i] * proj;
    }
    if (threadIdx.x == 0) inv_rms[row] = r;
}

// partials[c * hidden + i] = sum over rows [c * rows_per_chunk, min(rows, (c+1) * rows_per_chunk))
// of dy[row, i] * x[row, i] * inv_rms[row], summed in row order.
// grid (ceil(hidden / blockDim.x), chunks); one thread per (column, chunk).
extern "C" __global__ void rmsnorm_bwd_dgamma_partial_f32(const float* __restrict__ x,
                                                          const float* __restrict__ dy,
                                                          const float* __restrict__ inv_rms,
                                                          float* __restrict__ partials,
                                                          int rows, int hidden,
                                                          int rows_per_chunk) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int c = blockIdx.y;
    if (i >= hidden) return;
    const int r0 = c * rows_per_chunk;
    const int r1 = min(rows, r0 + rows_per_chunk);
    float acc = 0.0f;
    for (int r = r0; r < r1; ++r) {
        const size_t k = (size_t)r * hidden + i;
        acc += dy[k] * x[k] * inv_rms[r];
    }
    partials[(size_t)c * hidden + i] = acc;
}

// dgamma[i] = sum_{c < chunks} partials[c * hidden + i], in chunk order, for i < n_write.
extern "C" __global__ void rmsnorm_bwd_dgamma_final_f32(const float* __restrict__ partials,
                                                        float* __restrict__ dgamma,
                                                        int hidden, int chunks, int n_write) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= hidden || i >= n_write) return;
    float acc = 0.0f;
    for (int c = 0; c < chunks; ++c) acc += partials[(size_t)c * hidden + i];
    dgamma[i] = acc;
}
