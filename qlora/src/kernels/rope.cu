// Rotary position embedding, NeoX "halves" layout. x [batch, seq, heads,
// head_dim] row-major, half = head_dim / 2. The pair (x_i, x_{i+half}) of a
// head vector at sequence position pos is rotated by
//
//   angle = sign * pos * theta^(-2i / head_dim)
//   y_i        = x_i cos(angle) - x_{i+half} sin(angle)
//   y_{i+half} = x_i sin(angle) + x_{i+half} cos(angle)
//
// forward: sign = +1; backward: the transpose of a rotation is its inverse,
// so dx = R(-angle) dy (sign = -1).
//
// One thread per (position, pair i, group of ROPE_HEADS heads), grid-stride;
// consecutive threads take consecutive i, so a warp reads and writes whole
// lines of each head. Pair p = ((b * seq + pos) * heads + h) * half + i is
// written only when p < npairs (npairs is batch * seq * heads * half, less
// only under the test-only "last element unwritten" fault).
//
// The angle is formed in double, as theta^(-2i / head_dim) = exp(-2i /
// head_dim * ln theta), then reduced to [-pi, pi] in double; only the reduced
// angle is rounded to f32, so its sine and cosine (f32 sincosf, accurate on
// that range) carry ~2e-7 absolute error whatever pos is, where rounding the
// raw angle (hundreds of radians) would cost ~1e-5. The angle depends on
// (pos, i) only, so a thread computes it once for its ROPE_HEADS heads; their
// loads are issued first, so their latency hides the arithmetic.

#define ROPE_HEADS 4

__device__ __forceinline__ void rope_sincos(int pos, int i, int head_dim, double ln_theta,
                                            double sign, float* s, float* c) {
    const double two_pi = 6.283185307179586;
    const double angle = sign * (double)pos * exp(-2.0 * (double)i / (double)head_dim * ln_theta);
    const float reduced = (float)(angle - rint(angle / two_pi) * two_pi);
    sincosf(reduced, s, c);
}

__device__ void rope_rotate(const float* __restrict__ x, float* __restrict__ y,
                            long long npairs, int seq, int heads, int head_dim,
                            double ln_theta, double sign) {
    const int half = head_dim / 2;
    const int groups = (heads + ROPE_HEADS - 1) / ROPE_HEADS;
    const long long per_position = (long long)heads * half;
    const long long positions = (npairs + per_position - 1) / per_position;
    const long long work = positions * groups * half;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long w = (long long)blockIdx.x * blockDim.x + threadIdx.x; w < work; w += stride) {
        const int i = (int)(w % half);
        const long long rest = w / half;
        const int h0 = (int)(rest % groups) * ROPE_HEADS;
        const long long bpos = rest / groups;  // b * seq + pos
        const int pos = (int)(bpos % seq);
        float x1[ROPE_HEADS];
        float x2[ROPE_HEADS];
        bool live[ROPE_HEADS];
        #pragma unroll
        for (int g = 0; g < ROPE_HEADS; ++g) {
            const long long vec = bpos * heads + h0 + g;
            live[g] = h0 + g < heads && vec * half + i < npairs;
            const size_t base = (size_t)vec * head_dim;
            x1[g] = live[g] ? x[base + i] : 0.0f;
            x2[g] = live[g] ? x[base + i + half] : 0.0f;
        }
        float sf, cf;
        rope_sincos(pos, i, head_dim, ln_theta, sign, &sf, &cf);
        #pragma unroll
        for (int g = 0; g < ROPE_HEADS; ++g) {
            if (!live[g]) continue;
            const size_t base = (size_t)(bpos * heads + h0 + g) * head_dim;
            y[base + i] = x1[g] * cf - x2[g] * sf;
            y[base + i + half] = x1[g] * sf + x2[g] * cf;
        }
    }
}

#ifndef ROPE_QKV
extern "C" __global__ void rope_fwd_f32(const float* __restrict__ x, float* __restrict__ y,
                                        long long npairs, int seq, int heads, int head_dim,
                                        double ln_theta) {
    rope_rotate(x, y, npairs, seq, heads, head_dim, ln_theta, 1.0);
}

extern "C" __global__ void rope_bwd_f32(const float* __restrict__ dy, float* __restrict__ dx,
                                        long long npairs, int seq, int heads, int head_dim,
                                        double ln_theta) {
    rope_rotate(dy, dx, npairs, seq, heads, head_dim, ln_theta, -1.0);
}

#endif  // !ROPE_QKV

#ifdef ROPE_QKV
// ---------------------------------------------------------------------------
// The fused q/k/v projection's epilogue and its backward. The training step
// computes one layer's q, k, v and LoRA down-projections as one GEMM,
// y = n1 [Wq; Wk; Wv; Aq; Av]^T, a [rows, width] matrix whose columns are
// q (heads*d) | k (kv*d) | v (kv*d) | uq (r) | uv (r), width = the row stride.
//
// forward:  q = y_q + b_q + s uq Bq^T, k = y_k + b_k, v = y_v + b_v + s uv Bv^T
//           (Bq [heads*d, r], Bv [kv*d, r]; b = [b_q | b_k | b_v] the frozen
//           q/k/v bias, zeros for a model without one); qr = rope(q),
//           kr = rope(k), v packed. qr, kr, v are attention's packed
//           [rows, heads*d], [rows, kv*d], [rows, kv*d], in f32
//           (rope_qkv_fwd_f32) or rounded to bf16 (rope_qkv_fwd_bf16, the
//           operands of the bf16 flash kernels). The bias is a
//           constant of the forward, so the backward does not see it. It
//           also copies uq | uv to u_out [rows, 2 r], all the LoRA
//           gradients need of y (so the step keeps that, not y).
// backward: dq = rope^T(dqr), dk = rope^T(dkr); duq = s dq Bq, duv = s dv Bv;
//           written into dy's columns dq | dk | dv | duq | duv, so that
//           dn1 = dy [Wq; Wk; Wv; Aq; Av] is one GEMM.
//
// A block takes QKV_ROWS consecutive rows, so each LoRA B value it loads
// serves QKV_ROWS rows; the angles come from a host-computed table (no double
// math here, which keeps the module's NVRTC time small). r is a power of two <=
// QKV_MAX_RANK (the launcher checks). The LoRA sums are plain f32 FMA in a
// fixed order. Built as four modules of their own, the forward (ROPE_QKV 1)
// and the backward (ROPE_QKV 2), each for an f32 step or (ROPE_QKV_BF16) a
// bf16 one: a training step pre-warms the two it runs, and the parts
// compile side by side in less time than one module.

#define QKV_THREADS 512
#define QKV_FWD_THREADS 128
#define QKV_ROWS 4
#define QKV_MAX_RANK 16
#define QKV_MAX_HALF 128

// This block's rows' sines and cosines, [QKV_ROWS][half], from the table
// [2][seq][half] of sin and cos of pos * theta^(-2i / head_dim) (computed on
// the host in double, as rope_sincos does here); sign -1 rotates back.
__device__ __forceinline__ void qkv_angles(float* sn, float* cs, const float* __restrict__ table,
                                           int row0, int rows, int seq, int half, float sign) {
    for (int t = threadIdx.x; t < QKV_ROWS * half; t += blockDim.x) {
        const int rr = t / half, i = t % half;
        if (row0 + rr < rows) {
            const int at = ((row0 + rr) % seq) * half + i;
            sn[t] = sign * table[at];
            cs[t] = table[seq * half + at];
        }
    }
}

// acc[g][rr] = sum_j u[rr][u_col + j] * B[c[g], j] over the block's rows, for
// G columns c[g] of one LoRA B ([out, r]), each sum an FMA chain in j order.
// Each B value is loaded once for all QKV_ROWS rows. With r % 4 == 0 (the
// common case) B and u are read four values at a time: a 16-byte load of each
// column's B and one 16-byte shared load of u per row feed 4 G QKV_ROWS FMAs;
// one value at a time, the shared loads of u outnumbered the FMAs and the
// warps waited on them. q's two rotated columns (G = 2) share one loop, so u
// is read once for both. The loop stays rolled: unrolled it tripled the
// module's NVRTC time, which is on the cold pre-warm's critical path.
template <int G>
__device__ __forceinline__ void lora_up(const float (*u)[2 * QKV_MAX_RANK], int u_col,
                                        const float* __restrict__ bmat, const int (&c)[G], int r,
                                        float (&acc)[G][QKV_ROWS]) {
    #pragma unroll
    for (int g = 0; g < G; ++g)
        #pragma unroll
        for (int rr = 0; rr < QKV_ROWS; ++rr) acc[g][rr] = 0.0f;
    if (r % 4 != 0) {  // r is 1 or 2: one value at a time
        #pragma unroll 1
        for (int j = 0; j < r; ++j)
            #pragma unroll
            for (int g = 0; g < G; ++g) {
                const float b = __ldg(bmat + (size_t)c[g] * r + j);
                #pragma unroll
                for (int rr = 0; rr < QKV_ROWS; ++rr)
                    acc[g][rr] = fmaf(u[rr][u_col + j], b, acc[g][rr]);
            }
        return;
    }
    #pragma unroll 1
    for (int j = 0; j < r; j += 4) {
        float4 b[G];
        #pragma unroll
        for (int g = 0; g < G; ++g)
            b[g] = __ldg(reinterpret_cast<const float4*>(bmat + (size_t)c[g] * r + j));
        #pragma unroll
        for (int rr = 0; rr < QKV_ROWS; ++rr) {
            const float4 x = *reinterpret_cast<const float4*>(&u[rr][u_col + j]);
            #pragma unroll
            for (int g = 0; g < G; ++g) {
                acc[g][rr] = fmaf(x.x, b[g].x, acc[g][rr]);
                acc[g][rr] = fmaf(x.y, b[g].y, acc[g][rr]);
                acc[g][rr] = fmaf(x.z, b[g].z, acc[g][rr]);
                acc[g][rr] = fmaf(x.w, b[g].w, acc[g][rr]);
            }
        }
    }
}
#if ROPE_QKV == 1  // the forward's module

// qr, kr and v as S stores them: f32, or (StoreBf16) rounded to bf16, the
// operands of the bf16 flash attention kernels.
template <typename S>
__device__ __forceinline__ void rope_qkv_fwd(const float* __restrict__ y, long long ld,
                                             const float* __restrict__ bq,
                                             const float* __restrict__ bv,
                                             const float* __restrict__ bias, float s,
                                             typename S::T* __restrict__ qr,
                                             typename S::T* __restrict__ kr,
                                             typename S::T* __restrict__ v,
                                             float* __restrict__ u_out, int rows, int seq,
                                             int heads, int kv_heads, int head_dim, int r,
                                             const float* __restrict__ table) {
    // 16-byte aligned: lora_up reads each row's values four at a time (r,
    // and with it the v columns' offset, is then a multiple of 4).
    __shared__ __align__(16) float u[QKV_ROWS][2 * QKV_MAX_RANK];
    __shared__ float sn[QKV_ROWS * QKV_MAX_HALF], cs[QKV_ROWS * QKV_MAX_HALF];
    const int half = head_dim / 2;
    const int qd = heads * head_dim, kvd = kv_heads * head_dim;
    const int q_pairs = heads * half, k_pairs = kv_heads * half;
    const int items = q_pairs + k_pairs + kvd;
    // One item a thread: blockIdx.y picks QKV_FWD_THREADS of them. A block
    // that looped over all of a row group's items left most of its threads
    // idle in the last pass and waited on each pass's loads in turn. The
    // item is a rotated pair (c1, c1 + half) of q or k, or (pair false) a
    // column c1 of v; col is its part's first column in y and the bias.
    const int w = blockIdx.y * QKV_FWD_THREADS + threadIdx.x;
    const bool live = w < items, pair = w < q_pairs + k_pairs, is_q = w < q_pairs;
    const int p = is_q ? w : pair ? w - q_pairs : w - q_pairs - k_pairs;
    const int i = pair ? p % half : 0;
    const int c1 = pair ? (p / half) * head_dim + i : p;
    const int col = is_q ? 0 : pair ? qd : qd + kvd;
    // The row stride is the fused output's width: far below 2^31 / QKV_ROWS.
    const int ldi = (int)ld;
    for (int row0 = blockIdx.x * QKV_ROWS; row0 < rows; row0 += gridDim.x * QKV_ROWS) {
        const int nrows = min(QKV_ROWS, rows - row0);
        // The item's values of y and the bias are loaded first: nothing
        // they feed waits on them before the block's u and angles arrive.
        const float* yb = y + (size_t)row0 * ld;
        float y1[QKV_ROWS], y2[QKV_ROWS];
        #pragma unroll
        for (int rr = 0; rr < QKV_ROWS; ++rr) {
            y1[rr] = live && rr < nrows ? yb[rr * ldi + col + c1] : 0.0f;
            y2[rr] = pair && rr < nrows ? yb[rr * ldi + col + c1 + half] : 0.0f;
        }
        const float b1 = live ? bias[col + c1] : 0.0f;
        const float b2 = pair ? bias[col + c1 + half] : 0.0f;
        __syncthreads();  // the previous rows' u and angles are no longer read
        // The blocks of blockIdx.y 0 also copy the rows' u to u_out ([rows,
        // 2 r]): the LoRA gradients read it, not the rest of y.
        for (int t = threadIdx.x; t < QKV_ROWS * 2 * r; t += blockDim.x) {
            const int rr = t / (2 * r), j = t % (2 * r);
            const bool in = rr < nrows;
            u[rr][j] = in ? yb[rr * ldi + qd + 2 * kvd + j] : 0.0f;
            if (in && blockIdx.y == 0) u_out[(size_t)(row0 + rr) * 2 * r + j] = u[rr][j];
        }
        qkv_angles(sn, cs, table, row0, rows, seq, half, 1.0f);
        __syncthreads();
        if (!live) continue;
        if (pair) {
            float l[2][QKV_ROWS] = {};
            if (is_q) lora_up<2>(u, 0, bq, {c1, c1 + half}, r, l);
            const int out_ld = is_q ? qd : kvd;
            typename S::T* out = (is_q ? qr : kr) + (size_t)row0 * out_ld;
            #pragma unroll  // registers l, y1, y2: indexed by constants only
            for (int rr = 0; rr < QKV_ROWS; ++rr) {
                if (rr >= nrows) continue;
                const float x1 = (y1[rr] + b1) + s * l[0][rr];
                const float x2 = (y2[rr] + b2) + s * l[1][rr];
                const float sf = sn[rr * half + i], cf = cs[rr * half + i];
                S::put(out + rr * out_ld, c1, x1 * cf - x2 * sf);
                S::put(out + rr * out_ld, c1 + half, x1 * sf + x2 * cf);
            }
        } else {
            float lv[1][QKV_ROWS];
            lora_up<1>(u, r, bv, {c1}, r, lv);
            typename S::T* out = v + (size_t)row0 * kvd;
            #pragma unroll  // registers lv, y1: indexed by constants only
            for (int rr = 0; rr < QKV_ROWS; ++rr) {
                if (rr >= nrows) continue;
                S::put(out + rr * kvd, c1, (y1[rr] + b1) + s * lv[0][rr]);
            }
        }
    }
}

// Ten blocks an SM hold the forward to 48 registers a thread. Left free, its
// y values loaded ahead took it to 64, eight blocks an SM, and a second wave
// of blocks at qwen2.5-0.5b's shape made it slower than before the loads
// moved; bounded, it is faster.
#define QKV_FWD_MIN_BLOCKS 10
#define ROPE_QKV_FWD(NAME, S)                                                                  \
    extern "C" __global__ void __launch_bounds__(QKV_FWD_THREADS, QKV_FWD_MIN_BLOCKS)          \
        NAME(const float* __restrict__ y, long long ld, const float* __restrict__ bq,          \
             const float* __restrict__ bv, const float* __restrict__ bias, float s,           \
             S::T* __restrict__ qr, S::T* __restrict__ kr, S::T* __restrict__ v,              \
             float* __restrict__ u_out, int rows, int seq, int heads, int kv_heads,           \
             int head_dim, int r, const float* __restrict__ table) {                          \
        rope_qkv_fwd<S>(y, ld, bq, bv, bias, s, qr, kr, v, u_out, rows, seq, heads, kv_heads,  \
                        head_dim, r, table);                                                  \
    }
#ifndef ROPE_QKV_BF16
ROPE_QKV_FWD(rope_qkv_fwd_f32, StoreF32)
#else
ROPE_QKV_FWD(rope_qkv_fwd_bf16, StoreBf16)
#endif
#endif

#if ROPE_QKV == 2  // the backward's module
// acc[rr] += sum over this lane's c of g[rr][c] * B[c, j] (j = lane % r, c =
// lane / r + 32/r * k, over the block's warps) for each of the QKV_ROWS rows
// of g: lanes with consecutive j read consecutive floats of B. The sums are
// FMA chains in c order either way. UNROLLED (the bf16 module) takes every
// row, the last block's zeros past nrows too, so the loop unrolled by 4 is a
// plain run of loads and FMAs: measured, that made the bf16 step faster and
// the f32 step slower, so the f32 module keeps the loop that tests its rows.
template <bool UNROLLED>
__device__ __forceinline__ void lora_grad_partial(const float* g, int g_ld, const float* __restrict__ bmat,
                                                  int n, int r, int nrows, float* acc) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    const int step = 32 / r, j = lane % r;
    const int first = warp * step + lane / r, stride = warps * step;
    if (UNROLLED) {
        #pragma unroll 4
        for (int c = first; c < n; c += stride) {
            const float b = bmat[(size_t)c * r + j];
            #pragma unroll
            for (int rr = 0; rr < QKV_ROWS; ++rr) acc[rr] = fmaf(g[rr * g_ld + c], b, acc[rr]);
        }
    } else {
        #pragma unroll 2
        for (int c = first; c < n; c += stride) {
            const float b = bmat[(size_t)c * r + j];
            #pragma unroll
            for (int rr = 0; rr < QKV_ROWS; ++rr)
                if (rr < nrows) acc[rr] = fmaf(g[rr * g_ld + c], b, acc[rr]);
        }
    }
    // Lanes with the same j (lane % r) hold parts of one sum.
    #pragma unroll
    for (int rr = 0; rr < QKV_ROWS; ++rr)
        for (int off = 16; off >= r; off /= 2) acc[rr] += __shfl_xor_sync(0xffffffffu, acc[rr], off);
}

// dy[i] = v, and with BF16 also dy16[i] = bf16(v) (the bf16 step's operand of
// the q/k/v stack's input-gradient GEMM, rounded once, as a cast would).
template <bool BF16>
__device__ __forceinline__ void put_grad(float* dy, unsigned short* dy16, size_t i, float v) {
    dy[i] = v;
    if (BF16) dy16[i] = f32_to_bf16_bits(v);
}

template <bool BF16>
__device__ __forceinline__ void rope_qkv_bwd(const float* __restrict__ dqr, const float* __restrict__ dkr,
                                             const float* __restrict__ dv, const float* __restrict__ bq,
                                             const float* __restrict__ bv, float s, float* __restrict__ dy,
                                             unsigned short* __restrict__ dy16, long long ld, int rows,
                                             int seq, int heads, int kv_heads, int head_dim, int r,
                                             const float* __restrict__ table) {
    extern __shared__ float grad[];  // [QKV_ROWS][qd + kvd]: the rows' dq | dv
    __shared__ float sn[QKV_ROWS * QKV_MAX_HALF], cs[QKV_ROWS * QKV_MAX_HALF];
    __shared__ float part[QKV_THREADS / 32][QKV_ROWS][2 * QKV_MAX_RANK];
    const int half = head_dim / 2;
    const int qd = heads * head_dim, kvd = kv_heads * head_dim, g_ld = qd + kvd;
    const int q_pairs = heads * half, k_pairs = kv_heads * half;
    const int items = q_pairs + k_pairs + kvd;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int row0 = blockIdx.x * QKV_ROWS; row0 < rows; row0 += gridDim.x * QKV_ROWS) {
        const int nrows = min(QKV_ROWS, rows - row0);
        __syncthreads();  // the previous rows' grad, angles and parts are no longer read
        qkv_angles(sn, cs, table, row0, rows, seq, half, -1.0f);
        // The last block's rows past nrows hold zeros, so the unrolled LoRA
        // sums below need no test of the row (their sums are never stored).
        if (BF16)
            for (int t = nrows * g_ld + threadIdx.x; t < QKV_ROWS * g_ld; t += blockDim.x)
                grad[t] = 0.0f;
        __syncthreads();
        #pragma unroll 1
        for (int w = threadIdx.x; w < items; w += blockDim.x) {
            for (int rr = 0; rr < nrows; ++rr) {
                const size_t row = row0 + rr;
                const size_t at = row * ld;
                float* gr = grad + rr * g_ld;
                if (w < q_pairs + k_pairs) {
                    const bool is_q = w < q_pairs;
                    const int p = is_q ? w : w - q_pairs;
                    const int i = p % half;
                    const int c1 = (p / half) * head_dim + i, c2 = c1 + half;
                    const float* in = is_q ? dqr + row * qd : dkr + row * kvd;
                    const float g1 = in[c1], g2 = in[c2];
                    const float sf = sn[rr * half + i], cf = cs[rr * half + i];
                    const float x1 = g1 * cf - g2 * sf, x2 = g1 * sf + g2 * cf;
                    const int col = is_q ? 0 : qd;
                    put_grad<BF16>(dy, dy16, at + col + c1, x1);
                    put_grad<BF16>(dy, dy16, at + col + c2, x2);
                    if (is_q) {
                        gr[c1] = x1;
                        gr[c2] = x2;
                    }
                } else {
                    const int c = w - q_pairs - k_pairs;
                    const float g = dv[row * kvd + c];
                    put_grad<BF16>(dy, dy16, at + qd + kvd + c, g);
                    gr[qd + c] = g;
                }
            }
        }
        __syncthreads();
        // duq = dq Bq, duv = dv Bv for the block's rows: each warp sums its
        // share of the columns, then the warps' parts are added in warp order.
        float aq[QKV_ROWS] = {0.0f}, av[QKV_ROWS] = {0.0f};
        lora_grad_partial<BF16>(grad, g_ld, bq, qd, r, nrows, aq);
        lora_grad_partial<BF16>(grad + qd, g_ld, bv, kvd, r, nrows, av);
        if (lane < r) {
            #pragma unroll
            for (int rr = 0; rr < QKV_ROWS; ++rr) {
                part[warp][rr][lane] = aq[rr];
                part[warp][rr][r + lane] = av[rr];
            }
        }
        __syncthreads();
        for (int t = threadIdx.x; t < nrows * 2 * r; t += blockDim.x) {
            const int rr = t / (2 * r), j = t % (2 * r);
            float total = 0.0f;
            for (int k = 0; k < warps; ++k) total += part[k][rr][j];
            put_grad<BF16>(dy, dy16, (size_t)(row0 + rr) * ld + qd + 2 * kvd + j, s * total);
        }
    }
}

#ifndef ROPE_QKV_BF16
extern "C" __global__ void rope_qkv_bwd_f32(const float* __restrict__ dqr, const float* __restrict__ dkr,
                                            const float* __restrict__ dv, const float* __restrict__ bq,
                                            const float* __restrict__ bv, float s, float* __restrict__ dy,
                                            long long ld, int rows, int seq, int heads, int kv_heads,
                                            int head_dim, int r, const float* __restrict__ table) {
    rope_qkv_bwd<false>(dqr, dkr, dv, bq, bv, s, dy, nullptr, ld, rows, seq, heads, kv_heads,
                        head_dim, r, table);
}

#else
// The same, also writing dy's bf16 rounding into dy16 (the same layout).
extern "C" __global__ void rope_qkv_bwd_f32_bf16(const float* __restrict__ dqr,
                                                 const float* __restrict__ dkr,
                                                 const float* __restrict__ dv,
                                                 const float* __restrict__ bq,
                                                 const float* __restrict__ bv, float s,
                                                 float* __restrict__ dy,
                                                 unsigned short* __restrict__ dy16, long long ld,
                                                 int rows, int seq, int heads, int kv_heads,
                                                 int head_dim, int r,
                                                 const float* __restrict__ table) {
    rope_qkv_bwd<true>(dqr, dkr, dv, bq, bv, s, dy, dy16, ld, rows, seq, heads, kv_heads,
                       head_dim, r, table);
}
#endif
#endif
#endif  // ROPE_QKV
