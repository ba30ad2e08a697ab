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
// One thread per pair, grid-stride loop over pairs [0, npairs), where
// npairs = batch * seq * heads * half (a smaller value only under the test-only
// "last element unwritten" fault).

// Index is int when every pair index fits in one (the usual case): 64-bit
// division and remainder cost several times more than the rotation itself.
template <typename Index>
__device__ void rope_rotate(const float* __restrict__ x, float* __restrict__ y,
                            Index npairs, int seq, int heads, int head_dim,
                            double theta, double sign) {
    const int half = head_dim / 2;
    const Index stride = (Index)gridDim.x * blockDim.x;
    for (Index p = (Index)blockIdx.x * blockDim.x + threadIdx.x; p < npairs; p += stride) {
        const int i = (int)(p % half);
        const Index vec = p / half;            // (b * seq + pos) * heads + h
        const int pos = (int)((vec / heads) % seq);
        const size_t base = (size_t)vec * head_dim;
        const double angle = sign * (double)pos * pow(theta, -2.0 * (double)i / (double)head_dim);
        double s, c;
        sincos(angle, &s, &c);
        const float sf = (float)s;
        const float cf = (float)c;
        const float x1 = x[base + i];
        const float x2 = x[base + i + half];
        y[base + i] = x1 * cf - x2 * sf;
        y[base + i + half] = x1 * sf + x2 * cf;
    }
}

__device__ void rope_apply(const float* __restrict__ x, float* __restrict__ y, long long npairs,
                           int seq, int heads, int head_dim, double theta, double sign) {
    // The grid-stride index may pass npairs by up to one grid before the loop ends.
    const long long reach = npairs + (long long)gridDim.x * blockDim.x;
    if (reach <= 0x7fffffffLL) {
        rope_rotate<int>(x, y, (int)npairs, seq, heads, head_dim, theta, sign);
    } else {
        rope_rotate<long long>(x, y, npairs, seq, heads, head_dim, theta, sign);
    }
}

extern "C" __global__ void rope_fwd_f32(const float* __restrict__ x, float* __restrict__ y,
                                        long long npairs, int seq, int heads, int head_dim,
                                        double theta) {
    rope_apply(x, y, npairs, seq, heads, head_dim, theta, 1.0);
}

extern "C" __global__ void rope_bwd_f32(const float* __restrict__ dy, float* __restrict__ dx,
                                        long long npairs, int seq, int heads, int head_dim,
                                        double theta) {
    rope_apply(dy, dx, npairs, seq, heads, head_dim, theta, -1.0);
}
