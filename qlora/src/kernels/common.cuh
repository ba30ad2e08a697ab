// Shared by every kernel module: the cache compiles each module with this
// header in front of it (see kernels/mod.rs), so there is one copy of the
// reductions and of the vector-alignment test.

// True when p is 16-byte aligned, so float4 loads and stores are legal.
static __device__ __forceinline__ bool aligned16(const void* p) {
    return ((unsigned long long)p & 15ull) == 0;
}

// The f16 nearest (ties to even, as IEEE 754 and the host's
// `half::f16::from_f32`) to x, as its raw 16-bit pattern: half values travel
// as unsigned short, so no module needs the fp16 header.
static __device__ __forceinline__ unsigned short f32_to_f16_bits(float x) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}

// The bf16 nearest to x (ties to even, as the host's `half::bf16::from_f32`),
// as its raw 16-bit pattern. From sm_80 one `cvt` instruction; before it,
// integer arithmetic: the upper half of x's bits after adding half an ulp of
// bf16 (less one, plus the kept lowest bit, for ties to even). Either way a
// finite value or an infinity gets the same bits and a NaN stays a NaN,
// never rounded into an infinity (the `cvt` makes it the canonical quiet
// NaN, the integer path keeps its sign and upper payload).
static __device__ __forceinline__ unsigned short f32_to_bf16_bits(float x) {
#if __CUDA_ARCH__ >= 800
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
#else
    const unsigned u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
}

// The f32 value of bf16 bits h: exact (bf16 is f32's upper half).
static __device__ __forceinline__ float bf16_bits_to_f32(unsigned short h) {
    return __uint_as_float((unsigned)h << 16);
}

// The tensor of element k of a tensor table's concatenation: the largest i
// with offsets[i] <= k, for 0 <= k < offsets[n] (see gpu/table.rs).
static __device__ __forceinline__ int table_find(const long long* __restrict__ offsets, int n,
                                                 long long k) {
    int lo = 0;
    int hi = n - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (offsets[mid] <= k) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

// Programmatic dependent launch (Hopper and later; ops/launch.rs): a kernel
// launched as the dependent of the one before it on the stream may start while
// that one finishes, and must wait for it before it reads what it wrote. A
// kernel may also let its dependent start early. Both are no-ops when the
// launch was an ordinary one, and are compiled out before sm_90, where the
// launcher never asks for a dependent launch.
static __device__ __forceinline__ void wait_for_predecessor() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

static __device__ __forceinline__ void let_dependent_start() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// TF32 tensor cores (sm_80 on; the tensor-core attention kernels, the LoRA
// gradients).
//
// x rounded to the nearest tf32 value. From sm_90 on, cvt.rn (ties to even)
// is one instruction (F2FP); cvt.rna (ties away from zero), the only form
// before it, is emulated in about four integer instructions. The two differ
// only on exact ties, so both stay within tf32's half-ulp rounding error.
static __device__ __forceinline__ float tc_tf32(float x) {
    unsigned r;
#if __CUDA_ARCH__ >= 900
    asm("cvt.rn.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
#else
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
#endif
    return __uint_as_float(r);
}

// d += a b on one 16 x 8 x 8 tile; a and b hold tf32 values.
static __device__ __forceinline__ void tc_mma(float (&d)[4], const float (&a)[4], float b0,
                                              float b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(__float_as_uint(a[0])), "r"(__float_as_uint(a[1])), "r"(__float_as_uint(a[2])),
          "r"(__float_as_uint(a[3])), "r"(__float_as_uint(b0)), "r"(__float_as_uint(b1)));
}

// Reductions. `W` lanes of a warp (32, or 16 for a half warp) combine by xor
// shuffles, so every lane gets the result, in the same order on every run.
struct SumOp {
    template <typename T>
    __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <int W = 32, typename T, typename Op>
static __device__ __forceinline__ T warp_reduce(T v, Op op) {
    for (int o = W / 2; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The reduction of v over the block (blockDim.x a multiple of 32, at most
// 1024); every thread gets it. `identity` fills the lanes past the last warp.
template <typename T, typename Op>
static __device__ T block_reduce(T v, T identity, Op op) {
    __shared__ T partial[32];
    __shared__ T total;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    v = warp_reduce(v, op);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T s = lane < nwarps ? partial[lane] : identity;
        s = warp_reduce(s, op);
        if (lane == 0) total = s;
    }
    __syncthreads();
    const T out = total;
    __syncthreads();  // `partial` and `total` may be reused by the next call
    return out;
}

static __device__ __forceinline__ float block_sum(float v) { return block_reduce(v, 0.0f, SumOp()); }

static __device__ __forceinline__ float block_max(float v) {
    return block_reduce(v, __int_as_float(0xff800000), MaxOp());
}

static __device__ __forceinline__ double block_sum_d(double v) {
    return block_reduce(v, 0.0, SumOp());
}

// Elementwise maps over [0, n) in a grid-stride loop: y[k] = f(x[k]) and
// y[k] = f(a[k], b[k]). When every buffer is 16-byte aligned the first
// 4 * (n / 4) elements move as float4s (16-byte loads put enough bytes in
// flight per thread to cover DRAM latency; 4-byte loads reach about half the
// copy bandwidth) and the rest take the scalar loop. Each element gets the
// same f32 arithmetic either way, so results are bit-identical.
template <typename F>
static __device__ __forceinline__ void map1(const float* __restrict__ x, float* __restrict__ y,
                                            int n, F f) {
    const int tid = blockIdx.x * blockDim.x + threadIdx.x;
    const int stride = gridDim.x * blockDim.x;
    int done = 0;
    if (aligned16(x) && aligned16(y)) {
        const int n4 = n / 4;
        const float4* x4 = reinterpret_cast<const float4*>(x);
        float4* y4 = reinterpret_cast<float4*>(y);
        for (int k = tid; k < n4; k += stride) {
            const float4 v = x4[k];
            y4[k] = make_float4(f(v.x), f(v.y), f(v.z), f(v.w));
        }
        done = 4 * n4;
    }
    for (int k = done + tid; k < n; k += stride) {
        y[k] = f(x[k]);
    }
}

// Where an elementwise result goes: an f32 as computed, or its f16 or bf16
// rounding (nearest, ties to even) for a 16-bit GEMM that reads it next,
// which would otherwise need a cast kernel of its own. `vec` says whether
// the four-at-a-time store is legal at y (16-byte aligned for f32, 8 for
// the 16-bit formats).
struct StoreF32 {
    typedef float T;
    static __device__ __forceinline__ bool vec(const T* y) { return aligned16(y); }
    static __device__ __forceinline__ void put4(T* y, long long k4, float a, float b, float c,
                                                float e) {
        reinterpret_cast<float4*>(y)[k4] = make_float4(a, b, c, e);
    }
    static __device__ __forceinline__ void put(T* y, long long k, float v) { y[k] = v; }
};
// A 16-bit format, whose Round gives an f32's bits (nearest, ties to even).
// Four values go as one 8-byte store (y 8-byte aligned), little-endian: the
// element of the lower index in the lower 16 bits.
template <unsigned short (*Round)(float)>
struct Store16 {
    typedef unsigned short T;
    static __device__ __forceinline__ bool vec(const T* y) {
        return ((unsigned long long)y & 7ull) == 0;
    }
    static __device__ __forceinline__ void put4(T* y, long long k4, float a, float b, float c,
                                                float e) {
        const unsigned lo = (unsigned)Round(a) | ((unsigned)Round(b) << 16);
        const unsigned hi = (unsigned)Round(c) | ((unsigned)Round(e) << 16);
        reinterpret_cast<uint2*>(y)[k4] = make_uint2(lo, hi);
    }
    static __device__ __forceinline__ void put(T* y, long long k, float v) { y[k] = Round(v); }
};
typedef Store16<f32_to_f16_bits> StoreF16;
typedef Store16<f32_to_bf16_bits> StoreBf16;

// Where an elementwise input comes from: f32, or bf16 bits (the values a
// GEMM stored rounded), read as the f32 values they are. `vec` says whether
// the four-at-a-time load is legal at x (16-byte aligned for f32, 8 for bf16).
struct LoadF32 {
    typedef float T;
    static __device__ __forceinline__ bool vec(const T* x) { return aligned16(x); }
    static __device__ __forceinline__ float4 get4(const T* x, long long k4) {
        return reinterpret_cast<const float4*>(x)[k4];
    }
    static __device__ __forceinline__ float get(const T* x, long long k) { return x[k]; }
};
struct LoadBf16 {
    typedef unsigned short T;
    static __device__ __forceinline__ bool vec(const T* x) {
        return ((unsigned long long)x & 7ull) == 0;
    }
    static __device__ __forceinline__ float4 get4(const T* x, long long k4) {
        const uint2 w = reinterpret_cast<const uint2*>(x)[k4];
        return make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u),
                           __uint_as_float(w.y << 16), __uint_as_float(w.y & 0xffff0000u));
    }
    static __device__ __forceinline__ float get(const T* x, long long k) {
        return bf16_bits_to_f32(x[k]);
    }
};

template <typename S = StoreF32, typename F>
static __device__ __forceinline__ void map2(const float* __restrict__ a, const float* __restrict__ b,
                                            typename S::T* __restrict__ y, int n, F f) {
    const int tid = blockIdx.x * blockDim.x + threadIdx.x;
    const int stride = gridDim.x * blockDim.x;
    int done = 0;
    if (aligned16(a) && aligned16(b) && S::vec(y)) {
        const int n4 = n / 4;
        const float4* a4 = reinterpret_cast<const float4*>(a);
        const float4* b4 = reinterpret_cast<const float4*>(b);
        for (int k = tid; k < n4; k += stride) {
            const float4 u = a4[k];
            const float4 v = b4[k];
            S::put4(y, k, f(u.x, v.x), f(u.y, v.y), f(u.z, v.z), f(u.w, v.w));
        }
        done = 4 * n4;
    }
    for (int k = done + tid; k < n; k += stride) {
        S::put(y, k, f(a[k], b[k]));
    }
}

// AdamW (adamw.cu, and the training step's one-launch form in train.cu).
// Bias corrections c = 1 - b^t by repeated squaring, as the host's powi
// does (a libm pow per thread costs registers and latency the streaming loop
// needs).
// b^e for e >= 0 by repeated squaring, in double.
static __device__ __forceinline__ double adamw_powi(double b, int e) {
    double r = 1.0;
    while (e > 0) {
        if (e & 1) r *= b;
        b *= b;
        e >>= 1;
    }
    return r;
}

// One element's update; returns p and writes m, v.
static __device__ __forceinline__ float adamw_1(float pk, float gk, float& m, float& v, float c1, float c2,
                                         float lr, float beta1, float beta2, float eps,
                                         float weight_decay) {
    const float mk = beta1 * m + (1.0f - beta1) * gk;
    const float vk = beta2 * v + (1.0f - beta2) * gk * gk;
    m = mk;
    v = vk;
    const float mhat = mk / c1;
    const float vhat = vk / c2;
    return pk - lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * pk);
}
