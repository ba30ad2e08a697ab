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
