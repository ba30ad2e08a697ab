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
// forward:  q = y_q + s uq Bq^T, v = y_v + s uv Bv^T (Bq [heads*d, r],
//           Bv [kv*d, r]); qr = rope(q), kr = rope(y_k), v packed. qr, kr, v
//           are attention's packed [rows, heads*d], [rows, kv*d], [rows, kv*d].
// backward: dq = rope^T(dqr), dk = rope^T(dkr); duq = s dq Bq, duv = s dv Bv;
//           written into dy's columns dq | dk | dv | duq | duv, so that
//           dn1 = dy [Wq; Wk; Wv; Aq; Av] is one GEMM.
//
// One block of QKV_THREADS per row (grid-stride over rows); the LoRA sums are
// plain f32 FMA in a fixed order; the angles are rope_sincos's, as in
// rope_rotate. Built as its own module (ROPE_QKV defined), the one the
// training step pre-warms.

#define QKV_THREADS 128
#define QKV_MAX_RANK 64

// s * sum_j u[j] * b[j] over r terms (b one row of a [out, r] LoRA B).
__device__ __forceinline__ float lora_dot(const float* u, const float* __restrict__ b, int r, float s) {
    float acc = 0.0f;
    for (int j = 0; j < r; ++j) acc = fmaf(u[j], b[j], acc);
    return s * acc;
}

extern "C" __global__ void rope_qkv_fwd_f32(const float* __restrict__ y, long long ld,
                                            const float* __restrict__ bq, const float* __restrict__ bv,
                                            float s, float* __restrict__ qr, float* __restrict__ kr,
                                            float* __restrict__ v, int rows, int seq, int heads,
                                            int kv_heads, int head_dim, int r, double ln_theta) {
    __shared__ float u[2 * QKV_MAX_RANK];
    const int half = head_dim / 2;
    const int qd = heads * head_dim, kvd = kv_heads * head_dim;
    const int q_pairs = heads * half, k_pairs = kv_heads * half;
    const int items = q_pairs + k_pairs + kvd;
    for (int row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* yr = y + (size_t)row * ld;
        __syncthreads();  // the previous row's u is no longer read
        for (int j = threadIdx.x; j < 2 * r; j += blockDim.x) u[j] = yr[qd + 2 * kvd + j];
        __syncthreads();
        const int pos = row % seq;
        for (int w = threadIdx.x; w < items; w += blockDim.x) {
            if (w < q_pairs + k_pairs) {
                const bool is_q = w < q_pairs;
                const int p = is_q ? w : w - q_pairs;
                const int i = p % half;
                const int c1 = (p / half) * head_dim + i, c2 = c1 + half;
                float x1, x2;
                if (is_q) {
                    x1 = yr[c1] + lora_dot(u, bq + (size_t)c1 * r, r, s);
                    x2 = yr[c2] + lora_dot(u, bq + (size_t)c2 * r, r, s);
                } else {
                    x1 = yr[qd + c1];
                    x2 = yr[qd + c2];
                }
                float sf, cf;
                rope_sincos(pos, i, head_dim, ln_theta, 1.0, &sf, &cf);
                float* out = is_q ? qr + (size_t)row * qd : kr + (size_t)row * kvd;
                out[c1] = x1 * cf - x2 * sf;
                out[c2] = x1 * sf + x2 * cf;
            } else {
                const int c = w - q_pairs - k_pairs;
                v[(size_t)row * kvd + c] = yr[qd + kvd + c] + lora_dot(u + r, bv + (size_t)c * r, r, s);
            }
        }
    }
}

extern "C" __global__ void rope_qkv_bwd_f32(const float* __restrict__ dqr, const float* __restrict__ dkr,
                                            const float* __restrict__ dv, const float* __restrict__ bq,
                                            const float* __restrict__ bv, float s, float* __restrict__ dy,
                                            long long ld, int rows, int seq, int heads, int kv_heads,
                                            int head_dim, int r, double ln_theta) {
    extern __shared__ float grad[];  // this row's dq | dv, qd + kvd floats
    const int half = head_dim / 2;
    const int qd = heads * head_dim, kvd = kv_heads * head_dim;
    const int q_pairs = heads * half, k_pairs = kv_heads * half;
    const int items = q_pairs + k_pairs + kvd;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int row = blockIdx.x; row < rows; row += gridDim.x) {
        float* dyr = dy + (size_t)row * ld;
        const int pos = row % seq;
        __syncthreads();  // the previous row's grad is no longer read
        for (int w = threadIdx.x; w < items; w += blockDim.x) {
            if (w < q_pairs + k_pairs) {
                const bool is_q = w < q_pairs;
                const int p = is_q ? w : w - q_pairs;
                const int i = p % half;
                const int c1 = (p / half) * head_dim + i, c2 = c1 + half;
                const float* in = is_q ? dqr + (size_t)row * qd : dkr + (size_t)row * kvd;
                const float g1 = in[c1], g2 = in[c2];
                float sf, cf;
                rope_sincos(pos, i, head_dim, ln_theta, -1.0, &sf, &cf);
                const float x1 = g1 * cf - g2 * sf, x2 = g1 * sf + g2 * cf;
                if (is_q) {
                    dyr[c1] = x1;
                    dyr[c2] = x2;
                    grad[c1] = x1;
                    grad[c2] = x2;
                } else {
                    dyr[qd + c1] = x1;
                    dyr[qd + c2] = x2;
                }
            } else {
                const int c = w - q_pairs - k_pairs;
                const float g = dv[(size_t)row * kvd + c];
                dyr[qd + kvd + c] = g;
                grad[qd + c] = g;
            }
        }
        __syncthreads();
        // duq[j] = s sum_c dq[c] Bq[c, j], duv[j] = s sum_c dv[c] Bv[c, j]:
        // one warp per output, lanes over c, then a fixed-order shuffle tree.
        for (int j = warp; j < 2 * r; j += warps) {
            const bool is_q = j < r;
            const int n = is_q ? qd : kvd, jj = is_q ? j : j - r;
            const float* g = is_q ? grad : grad + qd;
            const float* b = is_q ? bq : bv;
            float acc = 0.0f;
            for (int c = lane; c < n; c += 32) acc = fmaf(g[c], b[(size_t)c * r + jj], acc);
            #pragma unroll
            for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
            if (lane == 0) dyr[qd + 2 * kvd + j] = s * acc;
        }
    }
}
#endif  // ROPE_QKV
