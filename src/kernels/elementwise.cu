// Elementwise ops over n values:
//
//   residual add:  y = a + b;     backward: da = dy, db = dy
//   scale:         y = s x;       backward: dx = s dy
//
// Grid-stride loops over [0, n); `n` smaller than the buffers only under the
// test-only "last element unwritten" fault.

extern "C" __global__ void residual_add_fwd_f32(const float* __restrict__ a, const float* __restrict__ b,
                                                float* __restrict__ y, int n) {
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += gridDim.x * blockDim.x) {
        y[k] = a[k] + b[k];
    }
}

extern "C" __global__ void residual_add_bwd_f32(const float* __restrict__ dy, float* __restrict__ da,
                                                float* __restrict__ db, int n) {
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += gridDim.x * blockDim.x) {
        const float g = dy[k];
        da[k] = g;
        db[k] = g;
    }
}

extern "C" __global__ void scale_fwd_f32(const float* __restrict__ x, float* __restrict__ y,
                                         float s, int n) {
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += gridDim.x * blockDim.x) {
        y[k] = s * x[k];
    }
}

extern "C" __global__ void scale_bwd_f32(const float* __restrict__ dy, float* __restrict__ dx,
                                         float s, int n) {
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += gridDim.x * blockDim.x) {
        dx[k] = s * dy[k];
    }
}
