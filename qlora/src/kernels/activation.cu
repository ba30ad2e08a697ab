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
// test-only "last element unwritten" fault. The float4 fast path with its
// scalar tail is map1 / map2 in common.cuh; the two-output backward spells
// it out. SwiGLU also writes bf16 (StoreBf16) for the bf16 step.
//
// Two modules (ACT_PART): 0 `swiglu`, the pair the training step runs, and
// 1 `silu`; a pre-warm compiles only the first.

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

#if ACT_PART == 1
extern "C" __global__ void silu_fwd_f32(const float* __restrict__ x, float* __restrict__ y, int n) {
    map1(x, y, n, [](float v) { return silu_fwd_1(v); });
}

extern "C" __global__ void silu_bwd_f32(const float* __restrict__ x, const float* __restrict__ dy,
                                        float* __restrict__ dx, int n) {
    map2(x, dy, dx, n, [](float v, float d) { return silu_bwd_1(v, d); });
}
#endif

#if ACT_PART == 0
// The forward and the backward write f32 (`_f32`) or, for a bf16 GEMM that
// reads them next, their bf16 rounding (`_f32_bf16`): the same f32
// arithmetic, rounded once at the store.
extern "C" __global__ void swiglu_fwd_f32(const float* __restrict__ gate, const float* __restrict__ up,
                                          float* __restrict__ y, int n) {
    map2<StoreF32>(gate, up, y, n, [](float g, float u) { return swiglu_fwd_1(g, u); });
}

extern "C" __global__ void swiglu_fwd_f32_bf16(const float* __restrict__ gate,
                                               const float* __restrict__ up,
                                               unsigned short* __restrict__ y, int n) {
    map2<StoreBf16>(gate, up, y, n, [](float g, float u) { return swiglu_fwd_1(g, u); });
}

template <typename S>
__device__ __forceinline__ void swiglu_bwd(const float* __restrict__ gate,
                                           const float* __restrict__ up,
                                           const float* __restrict__ dy,
                                           typename S::T* __restrict__ dgate,
                                           typename S::T* __restrict__ dup, int n) {
    const int tid = blockIdx.x * blockDim.x + threadIdx.x;
    const int stride = gridDim.x * blockDim.x;
    int done = 0;
    if (aligned16(gate) && aligned16(up) && aligned16(dy) && S::vec(dgate) && S::vec(dup)) {
        const int n4 = n / 4;
        const float4* g4 = reinterpret_cast<const float4*>(gate);
        const float4* u4 = reinterpret_cast<const float4*>(up);
        const float4* d4 = reinterpret_cast<const float4*>(dy);
        for (int k = tid; k < n4; k += stride) {
            const float4 g = g4[k];
            const float4 u = u4[k];
            const float4 d = d4[k];
            const float2 r0 = swiglu_bwd_1(g.x, u.x, d.x);
            const float2 r1 = swiglu_bwd_1(g.y, u.y, d.y);
            const float2 r2 = swiglu_bwd_1(g.z, u.z, d.z);
            const float2 r3 = swiglu_bwd_1(g.w, u.w, d.w);
            S::put4(dgate, k, r0.x, r1.x, r2.x, r3.x);
            S::put4(dup, k, r0.y, r1.y, r2.y, r3.y);
        }
        done = 4 * n4;
    }
    for (int k = done + tid; k < n; k += stride) {
        const float2 r = swiglu_bwd_1(gate[k], up[k], dy[k]);
        S::put(dgate, k, r.x);
        S::put(dup, k, r.y);
    }
}

extern "C" __global__ void swiglu_bwd_f32(const float* __restrict__ gate, const float* __restrict__ up,
                                          const float* __restrict__ dy, float* __restrict__ dgate,
                                          float* __restrict__ dup, int n) {
    swiglu_bwd<StoreF32>(gate, up, dy, dgate, dup, n);
}

extern "C" __global__ void swiglu_bwd_f32_bf16(const float* __restrict__ gate,
                                               const float* __restrict__ up,
                                               const float* __restrict__ dy,
                                               unsigned short* __restrict__ dgate,
                                               unsigned short* __restrict__ dup, int n) {
    swiglu_bwd<StoreBf16>(gate, up, dy, dgate, dup, n);
}
#endif
