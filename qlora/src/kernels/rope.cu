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
// One thread per pair p = ((b * seq + pos) * heads + h) * half + i, grid-stride
// over p < npairs (npairs is batch * seq * heads * half, less only under the
// test-only "last element unwritten" fault): consecutive threads take
// consecutive pairs, so a warp reads and writes whole lines.
//
// The angle is formed in double, as theta^(-2i / head_dim) = exp(-2i /
// head_dim * ln theta), then reduced to [-pi, pi] in double; only the reduced
// angle is rounded to f32, so its sine and cosine (f32 sincosf, accurate on
// that range) carry ~2e-7 absolute error whatever pos is, where rounding the
// raw angle (hundreds of radians) would cost ~1e-5. Each thread computes its
// own: no shared table, no barrier, and the loads are issued first, so their
// latency hides the arithmetic.

__device__ void rope_rotate(const float* __restrict__ x, float* __restrict__ y,
                            long long npairs, int seq, int heads, int head_dim,
                            double ln_theta, double sign) {
    const int half = head_dim / 2;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const double two_pi = 6.283185307179586;
    for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < npairs; p += stride) {
        const int i = (int)(p % half);
        const long long vec = p / half;  // (b * seq + pos) * heads + h
        const int pos = (int)((vec / heads) % seq);
        const size_t base = (size_t)vec * head_dim;
        const float x1 = x[base + i];
        const float x2 = x[base + i + half];
        const double angle = sign * (double)pos * exp(-2.0 * (double)i / (double)head_dim * ln_theta);
        const float reduced = (float)(angle - rint(angle / two_pi) * two_pi);
        float sf, cf;
        sincosf(reduced, &sf, &cf);
        y[base + i] = x1 * cf - x2 * sf;
        y[base + i + half] = x1 * sf + x2 * cf;
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
