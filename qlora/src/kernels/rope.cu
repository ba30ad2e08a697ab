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

__device__ void rope_rotate(const float* __restrict__ x, float* __restrict__ y,
                            long long npairs, int seq, int heads, int head_dim,
                            double ln_theta, double sign) {
    const int half = head_dim / 2;
    const int groups = (heads + ROPE_HEADS - 1) / ROPE_HEADS;
    const long long per_position = (long long)heads * half;
    const long long positions = (npairs + per_position - 1) / per_position;
    const long long work = positions * groups * half;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const double two_pi = 6.283185307179586;
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
        const double angle = sign * (double)pos * exp(-2.0 * (double)i / (double)head_dim * ln_theta);
        const float reduced = (float)(angle - rint(angle / two_pi) * two_pi);
        float sf, cf;
        sincosf(reduced, &sf, &cf);
        #pragma unroll
        for (int g = 0; g < ROPE_HEADS; ++g) {
            if (!live[g]) continue;
            const size_t base = (size_t)(bpos * heads + h0 + g) * head_dim;
            y[base + i] = x1[g] * cf - x2[g] * sf;
            y[base + i + half] = x1[g] * sf + x2[g] * cf;
        }
    }
}

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
