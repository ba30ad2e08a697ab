// Global gradient-norm clipping, entirely on the device (no host copy):
//
//   S     = sum_i g_i^2                            (squared_sum: partial + final)
//   scale = min(1, max_norm / (sqrt(S) + 1e-6))    (clip_scale)
//   g    <- scale * g                              (clip_apply)
//
// squared_sum is deterministic: the partial kernel is launched with a fixed
// grid; block b sums, in double, the elements b*blockDim + tid + k*stride in
// k order, then a fixed-shape tree; the final kernel (one block) sums the
// partials the same way. Several tensors can share one reduction: each
// tensor's partial launch writes its own slice of the partials buffer and one
// final launch sums them all.
//
// blockDim.x must be a multiple of 32 and at most 1024 for every kernel here
// that reduces.

// partials[blockIdx.x] = sum of x[k]^2 over this block's share of [0, n).
extern "C" __global__ void squared_sum_partial_f32(const float* __restrict__ x,
                                                   double* __restrict__ partials,
                                                   int n) {
    const int stride = gridDim.x * blockDim.x;
    double acc = 0.0;
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += stride) {
        const double v = (double)x[k];
        acc += v * v;
    }
    acc = block_sum_d(acc);
    if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// The same over every tensor of a table (gpu/table.rs, one column: g_i), in
// one launch: block b sums the elements b * blockDim + tid + j * stride of the
// concatenation, in j order, then the fixed-shape tree. The grid is fixed by
// the caller, so the order, and the sum, are the same on every run.
extern "C" __global__ void squared_sum_multi_partial_f32(const unsigned long long* __restrict__ ptrs,
                                                         const long long* __restrict__ offsets,
                                                         int n_tensors,
                                                         double* __restrict__ partials) {
    const long long total = offsets[n_tensors];
    const long long stride = (long long)gridDim.x * blockDim.x;
    double acc = 0.0;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += stride) {
        const int i = table_find(offsets, n_tensors, k);
        const float* g = reinterpret_cast<const float*>(ptrs[i]);
        const double v = (double)g[k - offsets[i]];
        acc += v * v;
    }
    acc = block_sum_d(acc);
    if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// sq[0] = sum_{p < nparts} partials[p]. One block.
extern "C" __global__ void squared_sum_final_f32(const double* __restrict__ partials,
                                                 double* __restrict__ sq,
                                                 int nparts) {
    if (blockIdx.x != 0) return;
    double acc = 0.0;
    for (int p = threadIdx.x; p < nparts; p += blockDim.x) acc += partials[p];
    acc = block_sum_d(acc);
    if (threadIdx.x == 0) sq[0] = acc;
}

// scale[0] = min(1, max_norm / (sqrt(sq[0]) + 1e-6)), computed in double.
// One thread; `write` is 0 only under the test-only "last element unwritten" fault.
extern "C" __global__ void clip_scale_f32(const double* __restrict__ sq,
                                          float* __restrict__ scale,
                                          float max_norm, int write) {
    if (blockIdx.x != 0 || threadIdx.x != 0 || !write) return;
    const double s = (double)max_norm / (sqrt(sq[0]) + 1e-6);
    scale[0] = (float)fmin(1.0, s);
}

// g[k] *= scale[0] for k in [0, n), in place; the scale never leaves the device.
// When g is 16-byte aligned the first 4 * (n / 4) values move as float4s
// (enough bytes in flight per thread to cover DRAM latency), the rest one by
// one; each value gets the same f32 product either way.
extern "C" __global__ void clip_apply_f32(float* __restrict__ g,
                                          const float* __restrict__ scale,
                                          int n) {
    const float s = scale[0];
    const int tid = blockIdx.x * blockDim.x + threadIdx.x;
    const int stride = gridDim.x * blockDim.x;
    int done = 0;
    if (((unsigned long long)g & 15ull) == 0) {
        const int n4 = n / 4;
        float4* g4 = reinterpret_cast<float4*>(g);
        for (int k = tid; k < n4; k += stride) {
            const float4 v = g4[k];
            g4[k] = make_float4(v.x * s, v.y * s, v.z * s, v.w * s);
        }
        done = 4 * n4;
    }
    for (int k = done + tid; k < n; k += stride) {
        g[k] *= s;
    }
}
