// Shared by every kernel module: the cache compiles each module with this
// header in front of it (see kernels/mod.rs), so there is one copy of the
// reductions and of the vector-alignment test.

// True when p is 16-byte aligned, so float4 loads and stores are legal.
static __device__ __forceinline__ bool aligned16(const void* p) {
    return ((unsigned long long)p & 15ull) == 0;
}

static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum of v over the block (blockDim.x a multiple of 32); every thread gets it.
static __device__ float block_sum(float v) {
    __shared__ float partial[32];
    __shared__ float total;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = lane < nwarps ? partial[lane] : 0.0f;
        s = warp_sum(s);
        if (lane == 0) total = s;
    }
    __syncthreads();
    const float out = total;
    __syncthreads();  // `partial` and `total` may be reused by the next call
    return out;
}

// Maximum of v over the block; every thread gets it.
static __device__ float block_max(float v) {
    __shared__ float partial[32];
    __shared__ float total;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = lane < nwarps ? partial[lane] : __int_as_float(0xff800000);
        s = warp_max(s);
        if (lane == 0) total = s;
    }
    __syncthreads();
    const float out = total;
    __syncthreads();
    return out;
}

