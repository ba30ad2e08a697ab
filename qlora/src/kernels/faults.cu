// Deliberately faulty kernels, launched only under a fault knob (faults.rs).

// Writes one element 2^40 floats past `out`: far beyond any allocation, so the
// store raises an illegal-address fault and poisons the CUDA context.
extern "C" __global__ void fault_oob_write_f32(float* out, unsigned long long n) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        out[n + (1ull << 40)] = 1.0f;
    }
}
