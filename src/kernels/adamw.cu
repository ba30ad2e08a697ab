// AdamW with bias correction and decoupled weight decay, for step t >= 1:
//
//   m    = b1 m + (1 - b1) g
//   v    = b2 v + (1 - b2) g^2
//   mhat = m / (1 - b1^t),  vhat = v / (1 - b2^t)
//   p   -= lr (mhat / (sqrt(vhat) + eps) + wd p)
//
// The step t is an argument; the bias corrections are computed from it in
// double on the device. p, m and v are updated in place. Grid-stride loop
// over [0, n); `n` smaller than the buffers only under the test-only "last
// element unwritten" fault.

extern "C" __global__ void adamw_step_f32(float* __restrict__ p,
                                          const float* __restrict__ g,
                                          float* __restrict__ m,
                                          float* __restrict__ v,
                                          int n, int step,
                                          float lr, float beta1, float beta2,
                                          float eps, float weight_decay) {
    const float c1 = (float)(1.0 - pow((double)beta1, (double)step));
    const float c2 = (float)(1.0 - pow((double)beta2, (double)step));
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
