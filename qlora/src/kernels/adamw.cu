// AdamW with bias correction and decoupled weight decay, for step t >= 1:
//
//   m    = b1 m + (1 - b1) g
//   v    = b2 v + (1 - b2) g^2
//   mhat = m / (1 - b1^t),  vhat = v / (1 - b2^t)
//   p   -= lr (mhat / (sqrt(vhat) + eps) + wd p)
//
// The step t is an argument; the bias corrections are computed from it in
// double on the device by adamw_powi (common.cuh), and each element is
// updated by adamw_1 (common.cuh), which the training step's one-launch
// AdamW (train.cu) shares. p, m and v are updated in place. Grid-stride loop
// over [0, n); `n` smaller than the buffers only under the test-only "last
// element unwritten" fault.

// When all four buffers are 16-byte aligned the first 4 * (n / 4) elements
// move as float4s (enough bytes in flight per thread to cover DRAM latency),
// the rest one by one; each element gets the same f32 arithmetic either way.
extern "C" __global__ void adamw_step_f32(float* __restrict__ p,
                                          const float* __restrict__ g,
                                          float* __restrict__ m,
                                          float* __restrict__ v,
                                          int n, int step,
                                          float lr, float beta1, float beta2,
                                          float eps, float weight_decay) {
    const float c1 = (float)(1.0 - adamw_powi((double)beta1, step));
    const float c2 = (float)(1.0 - adamw_powi((double)beta2, step));
    const int tid = blockIdx.x * blockDim.x + threadIdx.x;
    const int stride = gridDim.x * blockDim.x;
    int done = 0;
    const unsigned long long bits = (unsigned long long)p | (unsigned long long)g |
                                    (unsigned long long)m | (unsigned long long)v;
    if ((bits & 15ull) == 0) {
        const int n4 = n / 4;
        float4* p4 = reinterpret_cast<float4*>(p);
        const float4* g4 = reinterpret_cast<const float4*>(g);
        float4* m4 = reinterpret_cast<float4*>(m);
        float4* v4 = reinterpret_cast<float4*>(v);
        for (int k = tid; k < n4; k += stride) {
            float4 pk = p4[k];
            const float4 gk = g4[k];
            float4 mk = m4[k];
            float4 vk = v4[k];
            pk.x = adamw_1(pk.x, gk.x, mk.x, vk.x, c1, c2, lr, beta1, beta2, eps, weight_decay);
            pk.y = adamw_1(pk.y, gk.y, mk.y, vk.y, c1, c2, lr, beta1, beta2, eps, weight_decay);
            pk.z = adamw_1(pk.z, gk.z, mk.z, vk.z, c1, c2, lr, beta1, beta2, eps, weight_decay);
            pk.w = adamw_1(pk.w, gk.w, mk.w, vk.w, c1, c2, lr, beta1, beta2, eps, weight_decay);
            p4[k] = pk;
            m4[k] = mk;
            v4[k] = vk;
        }
        done = 4 * n4;
    }
    for (int k = done + tid; k < n; k += stride) {
        float mk = m[k];
        float vk = v[k];
        p[k] = adamw_1(p[k], g[k], mk, vk, c1, c2, lr, beta1, beta2, eps, weight_decay);
        m[k] = mk;
        v[k] = vk;
    }
}
