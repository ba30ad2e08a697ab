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
//
// The bf16 step keeps gate and up as the two halves of each row of one
// [T, 2 cols] matrix (one GEMM of the stacked [Wg; Wu] writes both), and
// its backward writes dgate and dup so for the one GEMM of [Wg; Wu] that
// reads both. `Rows` says where element k of a [n / cols, cols] operand
// lives: row k / cols of `ld` elements, column k % cols. The f32 kernels'
// operands are whole matrices of their own (cols = ld = n).
struct Rows {
    int cols;
    int ld;
    __device__ __forceinline__ long long at(long long k) const {
        return (k / cols) * (long long)ld + k % cols;
    }
    // Four consecutive elements from 4 k4 on stay in one row, in place.
    __device__ __forceinline__ bool vec() const { return cols % 4 == 0 && ld % 4 == 0; }
    __device__ __forceinline__ long long at4(long long k4) const { return at(4 * k4) / 4; }
};

template <typename L, typename S>
__device__ __forceinline__ void swiglu_fwd(const typename L::T* __restrict__ gate,
                                           const typename L::T* __restrict__ up, Rows in,
                                           typename S::T* __restrict__ y, int n) {
    const int tid = blockIdx.x * blockDim.x + threadIdx.x;
    const int stride = gridDim.x * blockDim.x;
    int done = 0;
    if (L::vec(gate) && L::vec(up) && in.vec() && S::vec(y)) {
        const int n4 = n / 4;
        for (int k = tid; k < n4; k += stride) {
            const float4 g = L::get4(gate, in.at4(k));
            const float4 u = L::get4(up, in.at4(k));
            S::put4(y, k, swiglu_fwd_1(g.x, u.x), swiglu_fwd_1(g.y, u.y), swiglu_fwd_1(g.z, u.z),
                    swiglu_fwd_1(g.w, u.w));
        }
        done = 4 * n4;
    }
    for (int k = done + tid; k < n; k += stride) {
        S::put(y, k, swiglu_fwd_1(L::get(gate, in.at(k)), L::get(up, in.at(k))));
    }
}

template <typename L, typename S>
__device__ __forceinline__ void swiglu_bwd(const typename L::T* __restrict__ gate,
                                           const typename L::T* __restrict__ up, Rows in,
                                           const typename L::T* __restrict__ dy,
                                           typename S::T* __restrict__ dgate,
                                           typename S::T* __restrict__ dup, Rows out, int n) {
    const int tid = blockIdx.x * blockDim.x + threadIdx.x;
    const int stride = gridDim.x * blockDim.x;
    int done = 0;
    if (L::vec(gate) && L::vec(up) && L::vec(dy) && S::vec(dgate) && S::vec(dup) && in.vec() &&
        out.vec()) {
        const int n4 = n / 4;
        for (int k = tid; k < n4; k += stride) {
            const float4 g = L::get4(gate, in.at4(k));
            const float4 u = L::get4(up, in.at4(k));
            const float4 d = L::get4(dy, k);
            const float2 r0 = swiglu_bwd_1(g.x, u.x, d.x);
            const float2 r1 = swiglu_bwd_1(g.y, u.y, d.y);
            const float2 r2 = swiglu_bwd_1(g.z, u.z, d.z);
            const float2 r3 = swiglu_bwd_1(g.w, u.w, d.w);
            S::put4(dgate, out.at4(k), r0.x, r1.x, r2.x, r3.x);
            S::put4(dup, out.at4(k), r0.y, r1.y, r2.y, r3.y);
        }
        done = 4 * n4;
    }
    for (int k = done + tid; k < n; k += stride) {
        const float2 r = swiglu_bwd_1(L::get(gate, in.at(k)), L::get(up, in.at(k)), L::get(dy, k));
        S::put(dgate, out.at(k), r.x);
        S::put(dup, out.at(k), r.y);
    }
}

extern "C" __global__ void swiglu_fwd_f32(const float* __restrict__ gate,
                                          const float* __restrict__ up, float* __restrict__ y,
                                          int n) {
    swiglu_fwd<LoadF32, StoreF32>(gate, up, Rows{n, n}, y, n);
}

extern "C" __global__ void swiglu_bwd_f32(const float* __restrict__ gate,
                                          const float* __restrict__ up,
                                          const float* __restrict__ dy, float* __restrict__ dgate,
                                          float* __restrict__ dup, int n) {
    const Rows whole{n, n};
    swiglu_bwd<LoadF32, StoreF32>(gate, up, whole, dy, dgate, dup, whole, n);
}

// The bf16 kernels take eight values (16 bytes) of a row at a time where
// cols is a multiple of 8 and every tensor 16-byte aligned, one item a
// thread (the launch's threads are n / 8), and the rest (all of them
// otherwise) one at a time. The arithmetic is the same per element either
// way.
__device__ __forceinline__ void bf16x8_get(const unsigned short* __restrict__ p, float (&v)[8]) {
    const uint4 w = *reinterpret_cast<const uint4*>(p);
    const unsigned x[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[2 * i] = __uint_as_float(x[i] << 16);
        v[2 * i + 1] = __uint_as_float(x[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ void bf16x8_put(unsigned short* __restrict__ p, const float (&v)[8]) {
    unsigned x[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
        x[i] = (unsigned)f32_to_bf16_bits(v[2 * i]) |
               ((unsigned)f32_to_bf16_bits(v[2 * i + 1]) << 16);
    *reinterpret_cast<uint4*>(p) = make_uint4(x[0], x[1], x[2], x[3]);
}

__device__ __forceinline__ bool bf16x8_ok(int cols, const void* a, const void* b,
                                          const void* c) {
    return cols % 8 == 0 && aligned16(a) && aligned16(b) && aligned16(c);
}

// Where pack k (values 8k .. 8k + 7 of an [n / cols, cols] output, cols % 8
// == 0) has its gate in an [n / cols, 2 cols] gate | up matrix; its up is
// cols further.
__device__ __forceinline__ size_t gate_pack_at(int k, int cols) {
    const int row = 8 * k / cols;
    return (size_t)row * 2 * cols + (8 * k - row * cols);
}

// `gu` [n / cols, 2 cols]: gate | up in each row.
extern "C" __global__ void swiglu_fwd_bf16(const unsigned short* __restrict__ gu,
                                           unsigned short* __restrict__ y, int n, int cols) {
    const Rows halves{cols, 2 * cols};
    const int tid = blockIdx.x * blockDim.x + threadIdx.x;
    const int stride = gridDim.x * blockDim.x;
    const int packs = bf16x8_ok(cols, gu, y, y) ? n / 8 : 0;
    for (int k = tid; k < packs; k += stride) {
        const size_t at = gate_pack_at(k, cols);
        float g[8], u[8], r[8];
        bf16x8_get(gu + at, g);
        bf16x8_get(gu + at + cols, u);
#pragma unroll
        for (int i = 0; i < 8; ++i) r[i] = swiglu_fwd_1(g[i], u[i]);
        bf16x8_put(y + 8 * (size_t)k, r);
    }
#pragma unroll 1
    for (int k = 8 * packs + tid; k < n; k += stride)
        StoreBf16::put(y, k, swiglu_fwd_1(LoadBf16::get(gu, halves.at(k)),
                                          LoadBf16::get(gu + cols, halves.at(k))));
}

// `gu` as above, `dgu` [n / cols, 2 cols]: dgate | dup in each row.
extern "C" __global__ void swiglu_bwd_bf16(const unsigned short* __restrict__ gu,
                                           const unsigned short* __restrict__ dy,
                                           unsigned short* __restrict__ dgu, int n, int cols) {
    const Rows halves{cols, 2 * cols};
    const int tid = blockIdx.x * blockDim.x + threadIdx.x;
    const int stride = gridDim.x * blockDim.x;
    const int packs = bf16x8_ok(cols, gu, dy, dgu) ? n / 8 : 0;
    for (int k = tid; k < packs; k += stride) {
        const size_t at = gate_pack_at(k, cols);
        float g[8], u[8], d[8], dg[8], du[8];
        bf16x8_get(gu + at, g);
        bf16x8_get(gu + at + cols, u);
        bf16x8_get(dy + 8 * (size_t)k, d);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const float2 r = swiglu_bwd_1(g[i], u[i], d[i]);
            dg[i] = r.x;
            du[i] = r.y;
        }
        bf16x8_put(dgu + at, dg);
        bf16x8_put(dgu + at + cols, du);
    }
#pragma unroll 1
    for (int k = 8 * packs + tid; k < n; k += stride) {
        const long long at = halves.at(k);
        const float2 r = swiglu_bwd_1(LoadBf16::get(gu, at), LoadBf16::get(gu + cols, at),
                                      LoadBf16::get(dy, k));
        StoreBf16::put(dgu, at, r.x);
        StoreBf16::put(dgu + cols, at, r.y);
    }
}
#endif
