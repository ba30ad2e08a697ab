// Seeded uniform draws on the device: the values the host draws in
// `model::weights::uniform_into`, bit for bit, without drawing them on the
// host and copying them up.
//
// A tensor's stream is rand_chacha's ChaCha8Rng: the ChaCha block function
// with 8 rounds, state = the constants, the 32-byte key (eight little-endian
// words), a 64-bit block counter (words 12-13) and a zero stream id (words
// 14-15); block b's output is its 16 words, in order. Value k of the tensor
// is one u64 of the stream, words 2k (low half) and 2k + 1 (high half), i.e.
// words 2(k mod 8) and 2(k mod 8) + 1 of block k / 8, mapped as rand 0.9's
// `UniformFloat<f64>` maps it into U(-a, a):
//
//   v = f64 with the bits 0x3FF0_0000_0000_0000 | (u >> 12)   (in [1, 2))
//   x = (v - 1) * (a - (-a)) + (-a)
//
// each operation rounded once (no fused multiply-add: the host's Rust code
// has none). The stored value is x rounded to f32 (nearest even, as the
// host's `x as f32`), and for the 16-bit formats that f32 rounded again to
// f16 or bf16 (nearest even), as the host rounds it.
//
// Launch: 1-D, grid-stride over ChaCha blocks; each thread makes one block
// and writes the (up to) 8 values of it that fall in the range. `first` is
// the index in the tensor's stream of y[0]; any n >= 0 and any grid.

__device__ __forceinline__ unsigned rotl32(unsigned x, int n) { return (x << n) | (x >> (32 - n)); }

#define CHACHA_QUARTER(a, b, c, d)                                                                \
    a += b; d ^= a; d = rotl32(d, 16);                                                            \
    c += d; b ^= c; b = rotl32(b, 12);                                                            \
    a += b; d ^= a; d = rotl32(d, 8);                                                             \
    c += d; b ^= c; b = rotl32(b, 7);

// The 16 words of ChaCha8 block `block` of the stream keyed by `key`.
__device__ __forceinline__ void chacha8_block(const unsigned key[8], unsigned long long block,
                                              unsigned out[16]) {
    unsigned in[16] = {0x61707865u, 0x3320646eu, 0x79622d32u, 0x6b206574u,
                       key[0], key[1], key[2], key[3], key[4], key[5], key[6], key[7],
                       (unsigned)block, (unsigned)(block >> 32), 0u, 0u};
#pragma unroll
    for (int i = 0; i < 16; ++i) out[i] = in[i];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        CHACHA_QUARTER(out[0], out[4], out[8], out[12]);
        CHACHA_QUARTER(out[1], out[5], out[9], out[13]);
        CHACHA_QUARTER(out[2], out[6], out[10], out[14]);
        CHACHA_QUARTER(out[3], out[7], out[11], out[15]);
        CHACHA_QUARTER(out[0], out[5], out[10], out[15]);
        CHACHA_QUARTER(out[1], out[6], out[11], out[12]);
        CHACHA_QUARTER(out[2], out[7], out[8], out[13]);
        CHACHA_QUARTER(out[3], out[4], out[9], out[14]);
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) out[i] += in[i];
}

// One value of U(-a, a) from the stream's u64 (lo, hi), as rand maps it.
__device__ __forceinline__ double uniform_value(unsigned lo, unsigned hi, double a) {
    const unsigned long long u = ((unsigned long long)hi << 32) | lo;
    const double v12 = __longlong_as_double((long long)(0x3FF0000000000000ull | (u >> 12)));
    const double scale = __dsub_rn(a, -a);
    return __dadd_rn(__dmul_rn(__dsub_rn(v12, 1.0), scale), -a);
}

struct DrawF32 {
    typedef float T;
    static __device__ __forceinline__ T put(double x) { return __double2float_rn(x); }
};
struct DrawF16 {
    typedef unsigned short T;
    static __device__ __forceinline__ T put(double x) { return f32_to_f16_bits(__double2float_rn(x)); }
};
struct DrawBf16 {
    typedef unsigned short T;
    static __device__ __forceinline__ T put(double x) { return f32_to_bf16_bits(__double2float_rn(x)); }
};

// y[i] = value first + i of the stream keyed by (k01, k23, k45, k67) (two
// key words each, the lower one in the low half), for i < n.
template <typename S>
__device__ __forceinline__ void draw_uniform(typename S::T* __restrict__ y, long long n,
                                             long long first, unsigned long long k01,
                                             unsigned long long k23, unsigned long long k45,
                                             unsigned long long k67, double a) {
    if (n <= 0) return;
    const unsigned key[8] = {(unsigned)k01, (unsigned)(k01 >> 32), (unsigned)k23,
                             (unsigned)(k23 >> 32), (unsigned)k45, (unsigned)(k45 >> 32),
                             (unsigned)k67, (unsigned)(k67 >> 32)};
    const long long first_block = first / 8;
    const long long blocks = (first + n - 1) / 8 - first_block + 1;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < blocks; t += stride) {
        const long long block = first_block + t;
        unsigned w[16];
        chacha8_block(key, (unsigned long long)block, w);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const long long i = block * 8 + j - first;
            if (i >= 0 && i < n) y[i] = S::put(uniform_value(w[2 * j], w[2 * j + 1], a));
        }
    }
}

extern "C" __global__ void draw_uniform_f32(float* y, long long n, long long first,
                                            unsigned long long k01, unsigned long long k23,
                                            unsigned long long k45, unsigned long long k67,
                                            double a) {
    draw_uniform<DrawF32>(y, n, first, k01, k23, k45, k67, a);
}

extern "C" __global__ void draw_uniform_f16(unsigned short* y, long long n, long long first,
                                            unsigned long long k01, unsigned long long k23,
                                            unsigned long long k45, unsigned long long k67,
                                            double a) {
    draw_uniform<DrawF16>(y, n, first, k01, k23, k45, k67, a);
}

extern "C" __global__ void draw_uniform_bf16(unsigned short* y, long long n, long long first,
                                             unsigned long long k01, unsigned long long k23,
                                             unsigned long long k45, unsigned long long k67,
                                             double a) {
    draw_uniform<DrawBf16>(y, n, first, k01, k23, k45, k67, a);
}
