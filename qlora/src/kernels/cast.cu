// f32 <-> f16 and f32 <-> bf16 conversion for the half-precision tensor-core
// GEMM paths.
//
// Half values travel as their raw 16-bit patterns (unsigned short) so the
// module needs no header: the conversions are the PTX `cvt` instructions,
// round-to-nearest-even for f32 -> f16 (f32_to_f16_bits, common.cuh), exact
// for f16 -> f32; bf16 by integer rounding of the f32 bits (f32_to_bf16_bits),
// exact back.
//
// Launch: 1-D, grid-stride loops; any n >= 0 and any grid.

__device__ __forceinline__ float f16_bits_to_f32(unsigned short h) {
    float x;
    asm("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(h));
    return x;
}

// The two 16-bit formats widened back to f32 (exact); the rounding the other
// way is the store policies' of common.cuh (StoreF16, StoreBf16).
struct F16Format {
    static __device__ __forceinline__ float widen(unsigned short h) { return f16_bits_to_f32(h); }
};
struct Bf16Format {
    static __device__ __forceinline__ float widen(unsigned short h) { return bf16_bits_to_f32(h); }
};

// y[i] = S's rounding of x[i] for i < n. Four elements per step where x is
// 16-byte and y 8-byte aligned (one float4 load, one 8-byte store: the casts
// of the GEMM inputs are bandwidth-bound); the rest, or everything when a
// view starts unaligned, one at a time.
template <typename S>
__device__ __forceinline__ void narrow(const float* __restrict__ x, unsigned short* __restrict__ y,
                                       long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    // `&`, not `&&`: both tests are a mask of a pointer, and one combined
    // branch is cheaper than two (NVRTC branches on each with `&&`).
    const bool vec = aligned16(x) & S::vec(y);
    const long long quads = vec ? n / 4 : 0;
    for (long long q = first; q < quads; q += stride) {
        const float4 v = reinterpret_cast<const float4*>(x)[q];
        S::put4(y, q, v.x, v.y, v.z, v.w);
    }
    for (long long i = 4 * quads + first; i < n; i += stride) S::put(y, i, x[i]);
}

// y[i] = f32(x[i]) for i < n (exact).
template <typename Fmt>
__device__ __forceinline__ void widen(const unsigned short* __restrict__ x, float* __restrict__ y,
                                      long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        y[i] = Fmt::widen(x[i]);
    }
}

extern "C" __global__ void cast_fwd_f32_f16(const float* __restrict__ x,
                                            unsigned short* __restrict__ y, long long n) {
    narrow<StoreF16>(x, y, n);
}

extern "C" __global__ void cast_fwd_f16_f32(const unsigned short* __restrict__ x,
                                            float* __restrict__ y, long long n) {
    widen<F16Format>(x, y, n);
}

extern "C" __global__ void cast_fwd_f32_bf16(const float* __restrict__ x,
                                             unsigned short* __restrict__ y, long long n) {
    narrow<StoreBf16>(x, y, n);
}

extern "C" __global__ void cast_fwd_bf16_f32(const unsigned short* __restrict__ x,
                                             float* __restrict__ y, long long n) {
    widen<Bf16Format>(x, y, n);
}

// For every tensor i of a table (gpu/table.rs; columns src: f32, copy: f32,
// rounded: 16-bit bits; a column's address 0 where the tensor has none):
// copy[e] = src[e] and rounded[e] = S's rounding of src[e] (nearest, ties to
// even), over the first n_write elements of the tensors' concatenation. Many
// small copies and casts in one launch: the step's LoRA A rows, copied and
// rounded into every layer's q/k/v stacks before the first layer.
template <typename S>
__device__ __forceinline__ void copy_round_multi(const unsigned long long* __restrict__ ptrs,
                                                 const long long* __restrict__ offsets,
                                                 int n_tensors, long long n_write) {
    const long long total = min(offsets[n_tensors], n_write);
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += stride) {
        const int i = table_find(offsets, n_tensors, k);
        const long long e = k - offsets[i];
        const float v = reinterpret_cast<const float*>(ptrs[i])[e];
        float* copy = reinterpret_cast<float*>(ptrs[n_tensors + i]);
        unsigned short* rounded = reinterpret_cast<unsigned short*>(ptrs[2 * n_tensors + i]);
        if (copy) copy[e] = v;
        if (rounded) S::put(rounded, e, v);
    }
}

extern "C" __global__ void cast_multi_f32_f16(const unsigned long long* __restrict__ ptrs,
                                              const long long* __restrict__ offsets,
                                              int n_tensors, long long n_write) {
    copy_round_multi<StoreF16>(ptrs, offsets, n_tensors, n_write);
}

extern "C" __global__ void cast_multi_f32_bf16(const unsigned long long* __restrict__ ptrs,
                                               const long long* __restrict__ offsets,
                                               int n_tensors, long long n_write) {
    copy_round_multi<StoreBf16>(ptrs, offsets, n_tensors, n_write);
}
