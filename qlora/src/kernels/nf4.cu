// NormalFloat4 (NF4) block quantisation (QLoRA), and GEMMs that read NF4
// weights directly.
//
// Layout (matches model/nf4.rs value for value; only the packing differs):
//   - a tensor of `len` values (len a multiple of NF4_BLOCK = 64, checked by
//     the launcher) is cut into blocks of 64 consecutive values;
//   - absmax[b] = max_i |w_i| over block b (f32; exact, max does not round);
//   - code_i = argmin_c |w_i / absmax_b - NF4_CODE_BOOK[c]|, ties to the lower
//     code, 7 (the exact zero) for every value of an all-zero block;
//   - codes are packed two per byte: byte e/2 holds element e in its low
//     nibble when e is even and in its high nibble when e is odd;
//   - deq_i = NF4_CODE_BOOK[code_i] * absmax[i / 64].
//
// The code choice runs in double precision on purpose: w and absmax are f32,
// so the f64 quotient is exactly the host quantiser's, and the distance
// comparisons are the host's too; the codes come out bit-identical
// instead of flipping near the midpoints between two code values.
//
// `write_limit` (elements, in order) exists only so the test-only fault
// injection "last element unwritten" skips real stores; it is `len` (or the
// output length) otherwise.

#define NF4_BLOCK 64
#define NF4_TILE 16

// The 16 values of bitsandbytes' NF4 code book, as in model/nf4.rs.
__constant__ double NF4_CODE_BOOK_F64[16] = {
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
};

// The same values rounded to f32, for dequantisation.
__constant__ float NF4_CODE_BOOK_F32[16] = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

#define NF4_ZERO_CODE 7

// Nearest code to w / amax (amax > 0), ties to the lower code: the
// host's `nearest_code` loop (model/nf4.rs), in the same arithmetic.
__device__ __forceinline__ unsigned int nf4_nearest_code(float w, float amax) {
    if (!(amax > 0.0f)) {
        return NF4_ZERO_CODE;
    }
    const double x = (double)w / (double)amax;
    unsigned int best = 0;
    double best_dist = __longlong_as_double(0x7ff0000000000000LL);  // +inf
    for (unsigned int c = 0; c < 16; ++c) {
        const double d = fabs(x - NF4_CODE_BOOK_F64[c]);
        if (d < best_dist) {
            best_dist = d;
            best = c;
        }
    }
    return best;
}

// The code of element e of a packed code array.
__device__ __forceinline__ unsigned int nf4_code_at(const unsigned char* __restrict__ codes,
                                                    long long e) {
    const unsigned int byte = codes[e >> 1];
    return (e & 1) ? (byte >> 4) : (byte & 0x0f);
}

// Dequantised element e of a packed NF4 tensor.
__device__ __forceinline__ float nf4_value_at(const unsigned char* __restrict__ codes,
                                              const float* __restrict__ absmax,
                                              long long e) {
    return NF4_CODE_BOOK_F32[nf4_code_at(codes, e)] * absmax[e / NF4_BLOCK];
}

// Quantise w[len] into codes[len / 2] (packed) and absmax[len / 64].
//
// One warp per NF4 block: lane l owns elements 2l and 2l + 1 of the block,
// so it writes exactly one byte. Launch: block 256 threads (8 warps),
// grid ceil((len / 64) / 8). Requires len % 64 == 0 (the launcher checks).
extern "C" __global__ void nf4_quantize_f32(const float* __restrict__ w,
                                            unsigned char* __restrict__ codes,
                                            float* __restrict__ absmax,
                                            long long len,
                                            long long write_limit) {
    const int lane = threadIdx.x & 31;
    const long long warps_per_block = blockDim.x >> 5;
    const long long blk = (long long)blockIdx.x * warps_per_block + (threadIdx.x >> 5);
    const long long n_blocks = len / NF4_BLOCK;
    // Whole warps leave together, so the shuffles below see all 32 lanes.
    if (blk >= n_blocks) {
        return;
    }
    const long long e0 = blk * NF4_BLOCK + 2 * lane;
    const float w0 = w[e0];
    const float w1 = w[e0 + 1];

    const float amax = warp_reduce(fmaxf(fabsf(w0), fabsf(w1)), MaxOp());

    const unsigned int c0 = nf4_nearest_code(w0, amax);
    const unsigned int c1 = nf4_nearest_code(w1, amax);
    if (e0 + 1 < write_limit) {
        codes[e0 >> 1] = (unsigned char)(c0 | (c1 << 4));
    }
    if (lane == 0 && blk * NF4_BLOCK + NF4_BLOCK - 1 < write_limit) {
        absmax[blk] = amax;
    }
}

// The code book into the block's shared memory, for all its threads: a warp's
// lookups hit up to 16 different entries, which the constant cache would
// serve one address at a time, while shared memory serves them in one access.
static __device__ __forceinline__ void nf4_book_to_shared(float* book) {
    if (threadIdx.x < 16) {
        book[threadIdx.x] = NF4_CODE_BOOK_F32[threadIdx.x];
    }
    __syncthreads();
}

// out[i] = NF4_CODE_BOOK[code_i] * absmax[i / 64] for i < len.
//
// A warp dequantises spans of 256 consecutive elements: lane l loads the
// span's code word l (one 4-byte load: elements 8l .. 8l + 7) and the
// absmax of its block, then stores float4 l and float4 32 + l of the span,
// taking each one's code half-word from the lane that loaded it (a shuffle).
// So every store instruction of a warp writes 512 contiguous bytes: whole
// lines, where one float4 pair per thread would leave each instruction's
// lines half written. (In the suite on an H100 this took a 4864 x 896
// dequantisation from 12.5 us to 9.1 us.) The code book sits in shared memory: a warp's lookups
// hit up to 16 different entries, which the constant cache would serve one
// address at a time, while shared memory serves them in one access. A
// float4 that reaches past `write_limit` stores element by element.
//
// Launch: 1-D, grid-stride loop over the ceil(len / 256) spans, one per warp,
// blocks of a multiple of 32 threads. Requires len % 64 == 0 (the launcher
// checks), 16-byte aligned `out` and 4-byte aligned `codes` (whole
// allocations are).
extern "C" __global__ void nf4_dequantize_f32(const unsigned char* __restrict__ codes,
                                              const float* __restrict__ absmax,
                                              float* __restrict__ out,
                                              long long len,
                                              long long write_limit) {
    __shared__ float book[16];
    nf4_book_to_shared(book);
    const int lane = threadIdx.x & 31;
    const long long words = len / 8;
    const long long spans = (len + 255) / 256;
    const long long warps = (long long)gridDim.x * (blockDim.x / 32);
    const unsigned int* codes4 = reinterpret_cast<const unsigned int*>(codes);
    for (long long s = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; s < spans;
         s += warps) {
        const long long w = s * 32 + lane;
        const unsigned int word = w < words ? codes4[w] : 0u;
        const float amax = w < words ? absmax[w / (NF4_BLOCK / 8)] : 0.0f;
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            // float4 32h + l holds elements 4(32h + l) .. + 3 of the span: the
            // low or high half of word 16h + l / 2.
            const int src = 16 * h + lane / 2;
            const unsigned int bits = __shfl_sync(0xffffffffu, word, src) >> (16 * (lane & 1));
            const float a = __shfl_sync(0xffffffffu, amax, src);
            const long long e0 = s * 256 + 4 * (32 * h + lane);
            if (e0 >= len) continue;
            const float v[4] = {book[bits & 15u] * a, book[(bits >> 4) & 15u] * a,
                                book[(bits >> 8) & 15u] * a, book[(bits >> 12) & 15u] * a};
            if (e0 + 4 <= write_limit) {
                *reinterpret_cast<float4*>(out + e0) = make_float4(v[0], v[1], v[2], v[3]);
            } else {
                for (int j = 0; j < 4; ++j) {
                    if (e0 + j < write_limit) out[e0 + j] = v[j];
                }
            }
        }
    }
}

// Words of codes one warp dequantises per pass of nf4_dequantize_bf16: four
// per lane, loaded before any is stored, so that each thread keeps four loads
// in flight (one was too few to cover the memory's latency).
#define NF4_BF16_WARP_WORDS 128

// As nf4_dequantize_f32, each value rounded to bf16 (raw bits, nearest, ties
// to even): the operand of a bf16 GEMM. A warp takes 128 consecutive code
// words (1,024 elements) per pass; lane l handles words 32j + l, j = 0..3,
// and stores each word's eight values as one 16-byte store (element 8w + j
// sits in bits 4j .. 4j + 3 of word w), so each store instruction of the warp
// writes 512 contiguous bytes with no shuffles. A word that reaches past
// `write_limit` stores element by element.
//
// A layer's q/k/v stack [Wq; Wk; Wv; Aq; Av] takes its LoRA A rows in the
// same launch: rows_a and rows_b (f32, rows_len values each) rounded to bf16
// after the codes' values, out[len + i] = bf16(rows_a[i]) and
// out[len + rows_len + i] = bf16(rows_b[i]), one thread a value,
// grid-stride; rows_len 0 for a projection. `write_limit` bounds the codes'
// part only.
//
// Launch: 1-D, grid-stride loop over the warps' passes, blocks of a multiple
// of 32 threads. Requires len % 64 == 0 (the launcher checks), 16-byte
// aligned `out` and 4-byte aligned `codes`.
extern "C" __global__ void nf4_dequantize_bf16(const unsigned char* __restrict__ codes,
                                               const float* __restrict__ absmax,
                                               unsigned short* __restrict__ out,
                                               long long len, long long write_limit,
                                               const float* __restrict__ rows_a,
                                               const float* __restrict__ rows_b,
                                               long long rows_len) {
    __shared__ float book[16];
    nf4_book_to_shared(book);
    const int lane = threadIdx.x & 31;
    const long long words = len / 8;
    const long long passes = (words + NF4_BF16_WARP_WORDS - 1) / NF4_BF16_WARP_WORDS;
    const long long warps = (long long)gridDim.x * (blockDim.x / 32);
    const unsigned int* codes4 = reinterpret_cast<const unsigned int*>(codes);
    for (long long p = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; p < passes;
         p += warps) {
        unsigned int word[4];
        float a[4];
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            const long long w = p * NF4_BF16_WARP_WORDS + 32 * j + lane;
            word[j] = w < words ? codes4[w] : 0u;
            a[j] = w < words ? absmax[w / (NF4_BLOCK / 8)] : 0.0f;
        }
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            const long long w = p * NF4_BF16_WARP_WORDS + 32 * j + lane;
            if (w >= words) continue;
            unsigned int pair[4];
            #pragma unroll
            for (int q = 0; q < 4; ++q) {
                const unsigned int lo = f32_to_bf16_bits(book[(word[j] >> (8 * q)) & 15u] * a[j]);
                const unsigned int hi =
                    f32_to_bf16_bits(book[(word[j] >> (8 * q + 4)) & 15u] * a[j]);
                pair[q] = lo | (hi << 16);
            }
            const long long e0 = 8 * w;
            if (e0 + 8 <= write_limit) {
                reinterpret_cast<uint4*>(out)[w] = make_uint4(pair[0], pair[1], pair[2], pair[3]);
            } else {
                for (int q = 0; q < 8; ++q) {
                    if (e0 + q < write_limit) {
                        out[e0 + q] = (unsigned short)(pair[q / 2] >> (16 * (q & 1)));
                    }
                }
            }
        }
    }
    // A q/k/v stack's LoRA A rows after the codes (rows_len 0: none).
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < 2 * rows_len;
         i += stride) {
        const float v = i < rows_len ? rows_a[i] : rows_b[i - rows_len];
        out[len + i] = (unsigned short)f32_to_bf16_bits(v);
    }
}

// y[m, n] = x[m, k] . deq(W)^T with W [n, k] stored as NF4 (element j * k + p).
//
// A 16x16 shared-memory tiled GEMM whose W tile is dequantised on its way
// into shared memory: the f32 W never exists in global memory. Thread
// (ty, tx) loads W[col0 + ty, p0 + tx] (consecutive tx read consecutive
// codes) and stores it transposed, ws[p][j] = W[j, p].
//
// Launch: block (16, 16), grid (ceil(n / 16), ceil(m / 16)). Requires
// n * k % 64 == 0 (the launcher checks).
extern "C" __global__ void nf4_gemm_fwd_f32(const float* __restrict__ x,
                                            const unsigned char* __restrict__ codes,
                                            const float* __restrict__ absmax,
                                            float* __restrict__ y,
                                            int m, int n, int k,
                                            long long write_limit) {
    __shared__ float xs[NF4_TILE][NF4_TILE + 1];
    __shared__ float ws[NF4_TILE][NF4_TILE + 1];

    const int tx = threadIdx.x;
    const int ty = threadIdx.y;
    const int row = blockIdx.y * NF4_TILE + ty;   // i in [0, m)
    const int col = blockIdx.x * NF4_TILE + tx;   // j in [0, n)
    const int wrow = blockIdx.x * NF4_TILE + ty;  // the W row this thread loads

    float acc = 0.0f;
    for (int p0 = 0; p0 < k; p0 += NF4_TILE) {
        const int p = p0 + tx;
        // xs[ty][tx] = x[row, p0 + tx]
        xs[ty][tx] = (row < m && p < k) ? x[(size_t)row * k + p] : 0.0f;
        // ws[tx][ty] = W[wrow, p0 + tx], so ws[q][j] = W[col0 + j, p0 + q]
        ws[tx][ty] = (wrow < n && p < k)
                         ? nf4_value_at(codes, absmax, (long long)wrow * k + p)
                         : 0.0f;
        __syncthreads();

        #pragma unroll
        for (int q = 0; q < NF4_TILE; ++q) {
            acc = fmaf(xs[ty][q], ws[q][tx], acc);
        }
        __syncthreads();
    }

    if (row < m && col < n) {
        const long long idx = (long long)row * n + col;
        if (idx < write_limit) {
            y[idx] = acc;
        }
    }
}

// dx[m, k] = dy[m, n] . deq(W) with W [n, k] stored as NF4 (element p * k + j):
// the backward of nf4_gemm_fwd_f32 with respect to x.
//
// Same tiling; here the reduction runs over n and W is read row-major,
// ws[q][j] = W[p0 + q, col0 + j] (consecutive tx read consecutive codes).
//
// Launch: block (16, 16), grid (ceil(k / 16), ceil(m / 16)). Requires
// n * k % 64 == 0 (the launcher checks).
extern "C" __global__ void nf4_gemm_bwd_f32(const float* __restrict__ dy,
                                            const unsigned char* __restrict__ codes,
                                            const float* __restrict__ absmax,
                                            float* __restrict__ dx,
                                            int m, int n, int k,
                                            long long write_limit) {
    __shared__ float gs[NF4_TILE][NF4_TILE + 1];
    __shared__ float ws[NF4_TILE][NF4_TILE + 1];

    const int tx = threadIdx.x;
    const int ty = threadIdx.y;
    const int row = blockIdx.y * NF4_TILE + ty;  // i in [0, m)
    const int col = blockIdx.x * NF4_TILE + tx;  // j in [0, k)

    float acc = 0.0f;
    for (int p0 = 0; p0 < n; p0 += NF4_TILE) {
        // gs[ty][tx] = dy[row, p0 + tx]
        const int pg = p0 + tx;
        gs[ty][tx] = (row < m && pg < n) ? dy[(size_t)row * n + pg] : 0.0f;
        // ws[ty][tx] = W[p0 + ty, col]
        const int pw = p0 + ty;
        ws[ty][tx] = (pw < n && col < k)
                         ? nf4_value_at(codes, absmax, (long long)pw * k + col)
                         : 0.0f;
        __syncthreads();

        #pragma unroll
        for (int q = 0; q < NF4_TILE; ++q) {
            acc = fmaf(gs[ty][q], ws[q][tx], acc);
        }
        __syncthreads();
    }

    if (row < m && col < k) {
        const long long idx = (long long)row * k + col;
        if (idx < write_limit) {
            dx[idx] = acc;
        }
    }
}
