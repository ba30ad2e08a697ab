// Deliberately faulty kernels, launched only under a fault knob (faults.rs).

// Writes one element 2^40 floats past `out`: far beyond any allocation, so the
// store raises an illegal-address fault and poisons the CUDA context.
extern "C" __global__ void fault_oob_write_f32(float* out, unsigned long long n) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        out[n + (1ull << 40)] = 1.0f;
    }
}

// x[i] = f32(bf16(x[i])) for i < n: the f32 values rounded to bf16 in place,
// as if they were stored in bf16 (a bf16 master copy of trainable weights).
extern "C" __global__ void fault_round_bf16_f32(float* x, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        x[i] = bf16_bits_to_f32(f32_to_bf16_bits(x[i]));
    }
}
