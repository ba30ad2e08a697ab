// SiLU and SwiGLU, elementwise over n values:
//
//   s = sigmoid(x) = 1 / (1 + exp(-x))
//   silu(x)  = x s                 silu'(x) = s (1 + x (1 - s))
//   swiglu(gate, up) = silu(gate) * up
//   dgate = dy * up * silu'(gate),  dup = dy * silu(gate)
//
// 1 / (1 + exp(-x)) never produces NaN in f32: for x << 0 exp(-x) is inf and
// s is 0; for x >> 0 exp(-x) is 0 and s is 1.
//
// Grid-stride loops over [0, n); `n` smaller than the buffers only under the
// test-only "last element unwritten" fault. As in elementwise.cu, when every
// buffer is 16-byte aligned the first 4 * (n / 4) elements move as float4s
// (enough bytes in flight per thread to cover DRAM latency) and the rest take
// the scalar loop; each element gets the same f32 arithmetic either way.

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float silu_fwd_1(float v) { return v * sigmoidf(v); }

__device__ __forceinline__ float silu_bwd_1(float v, float d) {
    const float s = sigmoidf(v);
    return d * s * (1.0f + v * (1.0f - s));
}

__device__ __forceinline__ float swiglu_fwd_1(float g, float u) { return g * sigmoidf(g) * u; }

// (dgate, dup) of one element.
__device__ __forceinline__ float2 swiglu_bwd_1(float g, float u, float d) {
    const float s = sigmoidf(g);
    return make_float2(d * u * s * (1.0f + g * (1.0f - s)), d * g * s);
}

extern "C" __global__ void silu_fwd_f32(const float* __restrict__ x, float* __restrict__ y, int n) {
    const int tid = blockIdx.x * blockDim.x + threadIdx.x;
    const int stride = gridDim.x * blockDim.x;
    int done = 0;
    if (aligned16(x) && aligned16(y)) {
        const int n4 = n / 4;
        const float4* x4 = reinterpret_cast<const float4*>(x);
        float4* y4 = reinterpret_cast<float4*>(y);
        for (int k = tid; k < n4; k += stride) {
            const float4 v = x4[k];
            y4[k] = make_float4(silu_fwd_1(v.x), silu_fwd_1(v.y), silu_fwd_1(v.z), silu_fwd_1(v.w));
        }
        done = 4 * n4;
    }
    for (int k = done + tid; k < n; k += stride) {
        y[k] = silu_fwd_1(x[k]);
    }
}

extern "C" __global__ void silu_bwd_f32(const float* __restrict__ x, const float* __restrict__ dy,
                                        float* __restrict__ dx, int n) {
    const int tid = blockIdx.x * blockDim.x + threadIdx.x;
    const int stride = gridDim.x * blockDim.x;
    int done = 0;
    if (aligned16(x) && aligned16(dy) && aligned16(dx)) {
        const int n4 = n / 4;
        const float4* x4 = reinterpret_cast<const float4*>(x);
        const float4* d4 = reinterpret_cast<const float4*>(dy);
        float4* o4 = reinterpret_cast<float4*>(dx);
        for (int k = tid; k < n4; k += stride) {
            const float4 v = x4[k];
            const float4 d = d4[k];
            o4[k] = make_float4(silu_bwd_1(v.x, d.x), silu_bwd_1(v.y, d.y), silu_bwd_1(v.z, d.z),
                                silu_bwd_1(v.w, d.w));
        }
        done = 4 * n4;
    }
    for (int k = done + tid; k < n; k += stride) {
        dx[k] = silu_bwd_1(x[k], dy[k]);
    }
}

extern "C" __global__ void swiglu_fwd_f32(const float* __restrict__ gate, const float* __restrict__ up,
                                          float* __restrict__ y, int n) {
    const int tid = blockIdx.x * blockDim.x + threadIdx.x;
    const int stride = gridDim.x * blockDim.x;
    int done = 0;
    if (aligned16(gate) && aligned16(up) && aligned16(y)) {
        const int n4 = n / 4;
        const float4* g4 = reinterpret_cast<const float4*>(gate);
        const float4* u4 = reinterpret_cast<const float4*>(up);
        float4* y4 = reinterpret_cast<float4*>(y);
        for (int k = tid; k < n4; k += stride) {
            const float4 g = g4[k];
            const float4 u = u4[k];
            y4[k] = make_float4(swiglu_fwd_1(g.x, u.x), swiglu_fwd_1(g.y, u.y), swiglu_fwd_1(g.z, u.z),
                                swiglu_fwd_1(g.w, u.w));
        }
        done = 4 * n4;
    }
    for (int k = done + tid; k < n; k += stride) {
        y[k] = swiglu_fwd_1(gate[k], up[k]);
    }
}

extern "C" __global__ void swiglu_bwd_f32(const float* __restrict__ gate, const float* __restrict__ up,
                                          const float* __restrict__ dy, float* __restrict__ dgate,
                                          float* __restrict__ dup, int n) {
    const int tid = blockIdx.x * blockDim.x + threadIdx.x;
    const int stride = gridDim.x * blockDim.x;
    int done = 0;
    if (aligned16(gate) && aligned16(up) && aligned16(dy) && aligned16(dgate) &&
        aligned16(dup)) {
        const int n4 = n / 4;
        const float4* g4 = reinterpret_cast<const float4*>(gate);
        const float4* u4 = reinterpret_cast<const float4*>(up);
        const float4* d4 = reinterpret_cast<const float4*>(dy);
        float4* dg4 = reinterpret_cast<float4*>(dgate);
        float4* du4 = reinterpret_cast<float4*>(dup);
        for (int k = tid; k < n4; k += stride) {
            const float4 g = g4[k];
            const float4 u = u4[k];
            const float4 d = d4[k];
            const float2 r0 = swiglu_bwd_1(g.x, u.x, d.x);
            const float2 r1 = swiglu_bwd_1(g.y, u.y, d.y);
            const float2 r2 = swiglu_bwd_1(g.z, u.z, d.z);
            const float2 r3 = swiglu_bwd_1(g.w, u.w, d.w);
            dg4[k] = make_float4(r0.x, r1.x, r2.x, r3.x);
            du4[k] = make_float4(r0.y, r1.y, r2.y, r3.y);
        }
        done = 4 * n4;
    }
    for (int k = done + tid; k < n; k += stride) {
        const float2 r = swiglu_bwd_1(gate[k], up[k], dy[k]);
        dgate[k] = r.x;
        dup[k] = r.y;
    }
}
