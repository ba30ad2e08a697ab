// Helpers of the GPU training step that keep all step state on the device, so
// that a step captured as a CUDA graph can be replayed unchanged:
//
//   adamw_step_devt_f32     AdamW as in adamw.cu, but the step number t is read
//                           from device memory (a captured kernel argument
//                           would freeze t at its capture-time value);
//   step_count_advance_i32  t[0] += by, one thread (the graph advances t itself);
//   accumulate_fwd_f32      y += x, element-wise (gradient accumulation).
//
// AdamW with bias correction and decoupled weight decay, for step t >= 1:
//   m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2
//   p -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd p)

extern "C" __global__ void adamw_step_devt_f32(float* __restrict__ p,
                                               const float* __restrict__ g,
                                               float* __restrict__ m,
                                               float* __restrict__ v,
                                               int n, const int* __restrict__ step,
                                               float lr, float beta1, float beta2,
                                               float eps, float weight_decay) {
    const int t = step[0];
    const float c1 = (float)(1.0 - pow((double)beta1, (double)t));
    const float c2 = (float)(1.0 - pow((double)beta2, (double)t));
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += gridDim.x * blockDim.x) {
        const float gk = g[k];
        const float mk = beta1 * m[k] + (1.0f - beta1) * gk;
        const float vk = beta2 * v[k] + (1.0f - beta2) * gk * gk;
        m[k] = mk;
        v[k] = vk;
        const float mhat = mk / c1;
        const float vhat = vk / c2;
        const float pk = p[k];
        p[k] = pk - lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * pk);
    }
}

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
