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
// One thread per (b, pos, i), grid-stride: the angle's sine and cosine are
// computed once (in double, the expensive part) and applied to pair i of every
// head at that position. Pairs p = ((b * seq + pos) * heads + h) * half + i at
// or past npairs are not written (npairs is batch * seq * heads * half, less
// only under the test-only "last element unwritten" fault).

__device__ void rope_rotate(const float* __restrict__ x, float* __restrict__ y,
                            long long npairs, int batch, int seq, int heads, int head_dim,
                            double theta, double sign) {
    const int half = head_dim / 2;
    const long long n = (long long)batch * seq * half;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long w = (long long)blockIdx.x * blockDim.x + threadIdx.x; w < n; w += stride) {
        const int i = (int)(w % half);
        const long long bpos = w / half;  // b * seq + pos
        const int pos = (int)(bpos % seq);
        const double angle = sign * (double)pos * pow(theta, -2.0 * (double)i / (double)head_dim);
        double s, c;
        sincos(angle, &s, &c);
        const float sf = (float)s;
        const float cf = (float)c;
        for (int h = 0; h < heads; ++h) {
            const long long vec = bpos * heads + h;
            if (vec * half + i >= npairs) break;  // later heads have larger p
            const size_t base = (size_t)vec * head_dim;
            const float x1 = x[base + i];
            const float x2 = x[base + i + half];
            y[base + i] = x1 * cf - x2 * sf;
            y[base + i + half] = x1 * sf + x2 * cf;
        }
    }
}

extern "C" __global__ void rope_fwd_f32(const float* __restrict__ x, float* __restrict__ y,
                                        long long npairs, int batch, int seq, int heads,
                                        int head_dim, double theta) {
    rope_rotate(x, y, npairs, batch, seq, heads, head_dim, theta, 1.0);
}

extern "C" __global__ void rope_bwd_f32(const float* __restrict__ dy, float* __restrict__ dx,
                                        long long npairs, int batch, int seq, int heads,
                                        int head_dim, double theta) {
    rope_rotate(dy, dx, npairs, batch, seq, heads, head_dim, theta, -1.0);
}
