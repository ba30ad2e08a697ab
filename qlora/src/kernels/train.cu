// Helpers of the GPU training step that keep all step state on the device, so
// that a step captured as a CUDA graph can be replayed unchanged:
//
//   adamw_multi_devt_f32    AdamW as in adamw.cu (adamw_1, adamw_powi from
//                           common.cuh) over every tensor of a table
//                           (gpu/table.rs; columns p, g, m, v, scale) in one
//                           launch, each gradient first multiplied by its
//                           tensor's clip scale (when the scale column is set)
//                           in f32, as clip_apply does; the step number t is
//                           read from device memory (a captured kernel
//                           argument would freeze t at its capture-time value);
//   step_count_advance_i32  t[0] += by, one thread (the graph advances t itself);
//   accumulate_fwd_f32      y += x, element-wise (gradient accumulation);
//   accumulate_fwd_f32_bf16 the same, also writing the sum's bf16 rounding.
//
// AdamW with bias correction and decoupled weight decay, for step t >= 1:
//   m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2
//   p -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd p)

extern "C" __global__ void step_count_advance_i32(int* __restrict__ step, int by) {
    if (blockIdx.x == 0 && threadIdx.x == 0) step[0] += by;
}

extern "C" __global__ void accumulate_fwd_f32(float* __restrict__ y,
                                              const float* __restrict__ x,
                                              int n) {
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += gridDim.x * blockDim.x) {
        y[k] += x[k];
    }
}

// y += x, and y16 = bf16(y), the sum rounded once (the bf16 step's operand of
// the next input-gradient GEMM, which a cast would otherwise round).
extern "C" __global__ void accumulate_fwd_f32_bf16(float* __restrict__ y,
                                                   const float* __restrict__ x,
                                                   unsigned short* __restrict__ y16, int n) {
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += gridDim.x * blockDim.x) {
        const float v = y[k] + x[k];
        y[k] = v;
        y16[k] = f32_to_bf16_bits(v);
    }
}

extern "C" __global__ void adamw_multi_devt_f32(const unsigned long long* __restrict__ ptrs,
                                                const long long* __restrict__ offsets,
                                                int n_tensors, const int* __restrict__ step,
                                                float lr, float beta1, float beta2, float eps,
                                                float weight_decay) {
    const int t = step[0];
    const float c1 = (float)(1.0 - adamw_powi((double)beta1, t));
    const float c2 = (float)(1.0 - adamw_powi((double)beta2, t));
    const long long total = offsets[n_tensors];
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += stride) {
        const int i = table_find(offsets, n_tensors, k);
        const long long e = k - offsets[i];
        float* p = reinterpret_cast<float*>(ptrs[i]);
        const float* g = reinterpret_cast<const float*>(ptrs[n_tensors + i]);
        float* m = reinterpret_cast<float*>(ptrs[2 * n_tensors + i]);
        float* v = reinterpret_cast<float*>(ptrs[3 * n_tensors + i]);
        const float* scale = reinterpret_cast<const float*>(ptrs[4 * n_tensors + i]);
        float gk = g[e];
        if (scale != nullptr) gk *= scale[0];
        p[e] = adamw_1(p[e], gk, m[e], v[e], c1, c2, lr, beta1, beta2, eps, weight_decay);
    }
}
