// SiLU and SwiGLU, elementwise over n values:
//
//   s = sigmoid(x) = 1 / (1 + exp(-x))
//   silu(x)  = x s                 silu'(x) = s (1 + x (1 - s))
//   swiglu(gate, up) = silu(gate) * up
//   dgate = dy * up * silu'(gate),  dup = dy * silu(gate)
//
// 1 / (1 + exp(-x)) never produces NaN in f32: for x << 0 exp(-x) is inf and
// s is 0; for x >> 0 exp(-x) is 0 and s is 1.
//
// Grid-stride loops over [0, n); `n` smaller than the buffers only under the
// test-only "last element unwritten" fault.

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

extern "C" __global__ void silu_fwd_f32(const float* __restrict__ x, float* __restrict__ y, int n) {
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += gridDim.x * blockDim.x) {
        const float v = x[k];
        y[k] = v * sigmoidf(v);
    }
}

extern "C" __global__ void silu_bwd_f32(const float* __restrict__ x, const float* __restrict__ dy,
                                        float* __restrict__ dx, int n) {
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += gridDim.x * blockDim.x) {
        const float v = x[k];
        const float s = sigmoidf(v);
        dx[k] = dy[k] * s * (1.0f + v * (1.0f - s));
    }
}

extern "C" __global__ void swiglu_fwd_f32(const float* __restrict__ gate, const float* __restrict__ up,
                                          float* __restrict__ y, int n) {
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += gridDim.x * blockDim.x) {
        const float g = gate[k];
        y[k] = g * sigmoidf(g) * up[k];
    }
}

extern "C" __global__ void swiglu_bwd_f32(const float* __restrict__ gate, const float* __restrict__ up,
                                          const float* __restrict__ dy, float* __restrict__ dgate,
                                          float* __restrict__ dup, int n) {
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += gridDim.x * blockDim.x) {
        const float g = gate[k];
        const float s = sigmoidf(g);
        const float d = dy[k];
        dgate[k] = d * up[k] * s * (1.0f + g * (1.0f - s));
        dup[k] = d * g * s;
    }
}
