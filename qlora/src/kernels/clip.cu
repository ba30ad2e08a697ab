// Global gradient-norm clipping, entirely on the device (no host copy):
//
//   S     = sum_i g_i^2                            (squared_sum)
//   scale = min(1, max_norm / (sqrt(S) + 1e-6))    (clip_scale)
//   g    <- scale * g                              (clip_apply)
//
// squared_sum is deterministic: the partial kernels are launched with a fixed
// grid; block b sums, in double, its fixed share of the elements in a fixed
// order, then a fixed-shape tree, and writes partials[b]. A final kernel of
// one block sums the partials the same way and writes S. Several tensors can
// share one reduction: each tensor's partial launch writes its own slice of
// the partials buffer, and the final kernel sums them all.
//
// The final kernel is launched as the programmatic dependent of the last
// partial launch (ops/launch.rs), which lets it start at once: its one block
// is resident, waiting, when the partials land, so the reduction costs one
// launch's latency, not two. (The one-launch scheme before it, where every
// block fenced and counted itself on an atomic and the last one summed,
// measured 0.62 of a same-bytes copy in the suite on an H200; this one 0.81.)
//
// blockDim.x must be a multiple of 32 and at most 1024 for every kernel here
// that reduces.
//
// Two modules (CLIP_PART), each with the final kernel: 0 `clip`, what the
// training step runs (the squared sum over a tensor table, the scale; AdamW
// applies it), and 1 `clip_single`, the squared sum tensor by tensor and
// clip_apply.

// sq[0] = sum of partials[0, total) in a fixed order (when `write`; 0 only
// under the test-only "last element unwritten" fault). One block.
extern "C" __global__ void squared_sum_final_f64(const double* __restrict__ partials, int total,
                                                 double* __restrict__ sq, int write) {
    wait_for_predecessor();
    double acc = 0.0;
    for (int k = threadIdx.x; k < total; k += blockDim.x) acc += partials[k];
    acc = block_sum_d(acc);
    if (threadIdx.x == 0 && write) sq[0] = acc;
}

// float4s per thread per trip to memory in squared_sum_partial_f32 (the
// launcher's SQUARED_SUM_UNROLL).
#define SQ_UNROLL 4

#if CLIP_PART == 1
// partials[first + blockIdx.x] = sum of x[k]^2 over this block's share of
// [0, n): float4 k = blockIdx.x * blockDim.x + tid + j * stride in j order
// when x is 16-byte aligned, then the last n % 4 values (or every value, one
// by one, when it is not).
extern "C" __global__ void squared_sum_partial_f32(const float* __restrict__ x,
                                                   double* __restrict__ partials,
                                                   int n, int first) {
    let_dependent_start();  // the final kernel's one block, to wait resident
    const int tid = blockIdx.x * blockDim.x + threadIdx.x;
    const int stride = gridDim.x * blockDim.x;
    double acc = 0.0;
    int done = 0;
    if (aligned16(x)) {
        const int n4 = n / 4;
        const float4* x4 = reinterpret_cast<const float4*>(x);
        // SQ_UNROLL float4s in flight per thread before any is summed (the
        // sum is still in k order): the launcher sizes the grid so that a
        // tensor of up to SQ_UNROLL * 4 floats per thread takes one trip to
        // memory, not two.
        for (int k0 = tid; k0 < n4; k0 += SQ_UNROLL * stride) {
            float4 v[SQ_UNROLL];
            #pragma unroll
            for (int u = 0; u < SQ_UNROLL; ++u) {
                const int k = k0 + u * stride;
                v[u] = k < n4 ? x4[k] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
            #pragma unroll
            for (int u = 0; u < SQ_UNROLL; ++u) {
                acc += (double)v[u].x * v[u].x + (double)v[u].y * v[u].y +
                       (double)v[u].z * v[u].z + (double)v[u].w * v[u].w;
            }
        }
        done = 4 * n4;
    }
    for (int k = done + tid; k < n; k += stride) {
        const double v = (double)x[k];
        acc += v * v;
    }
    acc = block_sum_d(acc);
    if (threadIdx.x == 0) partials[first + blockIdx.x] = acc;
}
#endif

#if CLIP_PART == 0
// The same over every tensor of a table (gpu/table.rs, one column: g_i), in
// one launch: block b sums the elements b * blockDim + tid + j * stride of the
// concatenation, in j order, then the fixed-shape tree. The grid is fixed by
// the caller, so the order, and the sum, are the same on every run. A
// thread's elements ascend, so it finds each one's tensor by walking forward
// from the last one's instead of searching the whole table.
extern "C" __global__ void squared_sum_multi_partial_f32(const unsigned long long* __restrict__ ptrs,
                                                         const long long* __restrict__ offsets,
                                                         int n_tensors,
                                                         double* __restrict__ partials) {
    let_dependent_start();
    const long long total = offsets[n_tensors];
    const long long stride = (long long)gridDim.x * blockDim.x;
    double acc = 0.0;
    long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int i = k < total ? table_find(offsets, n_tensors, k) : 0;
    for (; k < total; k += stride) {
        while (offsets[i + 1] <= k) ++i;
        const float* g = reinterpret_cast<const float*>(ptrs[i]);
        const double v = (double)g[k - offsets[i]];
        acc += v * v;
    }
    acc = block_sum_d(acc);
    if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}
#endif

#if CLIP_PART == 0
// scale[0] = min(1, max_norm / (sqrt(sq[0]) + 1e-6)), computed in double.
// One thread; `write` is 0 only under the test-only "last element unwritten" fault.
extern "C" __global__ void clip_scale_f32(const double* __restrict__ sq,
                                          float* __restrict__ scale,
                                          float max_norm, int write) {
    if (blockIdx.x != 0 || threadIdx.x != 0 || !write) return;
    const double s = (double)max_norm / (sqrt(sq[0]) + 1e-6);
    scale[0] = (float)fmin(1.0, s);
}
#endif

#if CLIP_PART == 1
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
#endif
