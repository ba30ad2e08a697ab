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
// The angle and its sine/cosine are computed in double: pos * inv_freq reaches
// hundreds of radians, where the f32 rounding of the angle alone would cost
// ~1e-5 relative error. The rotation itself is f32.
//
// One block per position (b, pos): its first `half` threads compute the
// angles' sines and cosines (in double, the expensive part) once into shared
// memory, then every thread rotates pairs of that position's heads, one pair
// per thread (thread t: head t / half, pair t % half), so a warp reads and
// writes whole 128-byte lines and each position's `heads * half` pairs run in
// parallel. Pairs p = ((b * seq + pos) * heads + h) * half + i at or past
// npairs are not written (npairs is batch * seq * heads * half, less only
// under the test-only "last element unwritten" fault).
//
// Launch: grid.x = batch * seq, any blockDim.x that is a multiple of 32;
// half <= ROPE_MAX_HALF (the launcher checks).

#define ROPE_MAX_HALF 512

__device__ void rope_rotate(const float* __restrict__ x, float* __restrict__ y,
                            long long npairs, int seq, int heads, int head_dim,
                            double theta, double sign) {
    __shared__ float sin_i[ROPE_MAX_HALF];
    __shared__ float cos_i[ROPE_MAX_HALF];
    const int half = head_dim / 2;
    const long long bpos = blockIdx.x;  // b * seq + pos
    const int pos = (int)(bpos % seq);
    const int pairs = heads * half;
    // This thread's first pair is loaded before the angles are computed, so
    // the load's latency overlaps the double-precision trigonometry.
    const int t0 = threadIdx.x;
    const int h0 = t0 / half;
    const int i0 = t0 - h0 * half;
    const long long vec0 = bpos * heads + h0;
    const bool first = t0 < pairs && vec0 * half + i0 < npairs;
    const size_t base0 = (size_t)vec0 * head_dim;
    const float a1 = first ? x[base0 + i0] : 0.0f;
    const float a2 = first ? x[base0 + i0 + half] : 0.0f;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const double angle = sign * (double)pos * pow(theta, -2.0 * (double)i / (double)head_dim);
        double s, c;
        sincos(angle, &s, &c);
        sin_i[i] = (float)s;
        cos_i[i] = (float)c;
    }
    __syncthreads();
    if (first) {
        y[base0 + i0] = a1 * cos_i[i0] - a2 * sin_i[i0];
        y[base0 + i0 + half] = a1 * sin_i[i0] + a2 * cos_i[i0];
    }
    for (int t = t0 + blockDim.x; t < pairs; t += blockDim.x) {
        const int h = t / half;
        const int i = t - h * half;
        const long long vec = bpos * heads + h;
        if (vec * half + i >= npairs) break;  // later t have larger p
        const size_t base = (size_t)vec * head_dim;
        const float sf = sin_i[i];
        const float cf = cos_i[i];
        const float x1 = x[base + i];
        const float x2 = x[base + i + half];
        y[base + i] = x1 * cf - x2 * sf;
        y[base + i + half] = x1 * sf + x2 * cf;
    }
}

extern "C" __global__ void rope_fwd_f32(const float* __restrict__ x, float* __restrict__ y,
                                        long long npairs, int seq, int heads, int head_dim,
                                        double theta) {
    rope_rotate(x, y, npairs, seq, heads, head_dim, theta, 1.0);
}

extern "C" __global__ void rope_bwd_f32(const float* __restrict__ dy, float* __restrict__ dx,
                                        long long npairs, int seq, int heads, int head_dim,
                                        double theta) {
    rope_rotate(dy, dx, npairs, seq, heads, head_dim, theta, -1.0);
}
