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
// scalar tail is map1 / map2 in common.cuh for SiLU; SwiGLU spells it out,
// with its inputs and outputs in f32 or bf16 (LoadBf16, StoreBf16) for the
// bf16 step.
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
// Kernels `_f32` (f32 gate, up and results) and `_bf16`, for the bf16 step:
// gate, up and the backward's dy as its bf16 GEMMs stored them (`L`), and
// results rounded to bf16 for the bf16 GEMMs that read them next (`S`),
// each rounded once at the store. The arithmetic is f32 in both.
template <typename L, typename S>
__device__ __forceinline__ void swiglu_fwd(const typename L::T* __restrict__ gate,
                                           const typename L::T* __restrict__ up,
                                           typename S::T* __restrict__ y, int n) {
    const int tid = blockIdx.x * blockDim.x + threadIdx.x;
    const int stride = gridDim.x * blockDim.x;
    int done = 0;
    if (L::vec(gate) && L::vec(up) && S::vec(y)) {
        const int n4 = n / 4;
        for (int k = tid; k < n4; k += stride) {
            const float4 g = L::get4(gate, k);
            const float4 u = L::get4(up, k);
            S::put4(y, k, swiglu_fwd_1(g.x, u.x), swiglu_fwd_1(g.y, u.y), swiglu_fwd_1(g.z, u.z),
                    swiglu_fwd_1(g.w, u.w));
        }
        done = 4 * n4;
    }
    for (int k = done + tid; k < n; k += stride) {
        S::put(y, k, swiglu_fwd_1(L::get(gate, k), L::get(up, k)));
    }
}

template <typename L, typename S>
__device__ __forceinline__ void swiglu_bwd(const typename L::T* __restrict__ gate,
                                           const typename L::T* __restrict__ up,
                                           const typename L::T* __restrict__ dy,
                                           typename S::T* __restrict__ dgate,
                                           typename S::T* __restrict__ dup, int n) {
    const int tid = blockIdx.x * blockDim.x + threadIdx.x;
    const int stride = gridDim.x * blockDim.x;
    int done = 0;
    if (L::vec(gate) && L::vec(up) && L::vec(dy) && S::vec(dgate) && S::vec(dup)) {
        const int n4 = n / 4;
        for (int k = tid; k < n4; k += stride) {
            const float4 g = L::get4(gate, k);
            const float4 u = L::get4(up, k);
            const float4 d = L::get4(dy, k);
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
        const float2 r = swiglu_bwd_1(L::get(gate, k), L::get(up, k), L::get(dy, k));
        S::put(dgate, k, r.x);
        S::put(dup, k, r.y);
    }
}

#define SWIGLU_KERNELS(NAME, L, S)                                                              \
    extern "C" __global__ void swiglu_fwd_##NAME(const L::T* __restrict__ gate,                 \
                                                 const L::T* __restrict__ up,                   \
                                                 S::T* __restrict__ y, int n) {                 \
        swiglu_fwd<L, S>(gate, up, y, n);                                                       \
    }                                                                                           \
    extern "C" __global__ void swiglu_bwd_##NAME(                                               \
        const L::T* __restrict__ gate, const L::T* __restrict__ up, const L::T* __restrict__ dy,  \
        S::T* __restrict__ dgate, S::T* __restrict__ dup, int n) {                              \
        swiglu_bwd<L, S>(gate, up, dy, dgate, dup, n);                                          \
    }
SWIGLU_KERNELS(f32, LoadF32, StoreF32)
SWIGLU_KERNELS(bf16, LoadBf16, StoreBf16)
#endif
