//! The subject's CUDA kernels, as CUDA C source that NVRTC compiles at run
//! time for the device's own `compute_XY` (see [`crate::device`]).
//!
//! Three modules, so that a training step can need a module the pre-warm
//! did not load (the `update_module_loaded_late` mutant):
//! - `axpy`: `out = a*x + y` and a two-pass sum of squares;
//! - `line`: the block partial sums of a line fit's residuals;
//! - `sgd`: the line fit's gradients, loss and SGD update.

/// Threads per block of every kernel; the reductions' shared arrays are
/// sized by it.
pub const THREADS: u32 = 256;

/// The most blocks a grid-stride kernel is launched with.
pub const MAX_BLOCKS: u32 = 1024;

/// One NVRTC compilation unit and the kernels it defines.
#[derive(Debug, Clone, Copy)]
pub struct ModuleSource {
    pub name: &'static str,
    pub source: &'static str,
    pub kernels: &'static [&'static str],
}

/// `out[i] = a * x[i] + y[i]`; the two passes of `sum(x[i]^2)`: per-block
/// partials, then one block that adds `m` partials.
pub const AXPY: ModuleSource = ModuleSource {
    name: "axpy",
    kernels: &["axpy", "sum_squares_partial", "sum_partials"],
    source: r#"
#define THREADS 256
__device__ float block_sum(float v, float* s) {
    s[threadIdx.x] = v;
    __syncthreads();
    for (int k = THREADS / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k];
        __syncthreads();
    }
    return s[0];
}
extern "C" __global__ void axpy(int n, float a, const float* x, const float* y, float* out) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        out[i] = a * x[i] + y[i];
}
extern "C" __global__ void sum_squares_partial(int n, const float* x, float* partial) {
    __shared__ float s[THREADS];
    float acc = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        acc += x[i] * x[i];
    float total = block_sum(acc, s);
    if (threadIdx.x == 0) partial[blockIdx.x] = total;
}
extern "C" __global__ void sum_partials(int m, const float* partial, float* out) {
    __shared__ float s[THREADS];
    float acc = 0.0f;
    for (int i = threadIdx.x; i < m; i += blockDim.x) acc += partial[i];
    float total = block_sum(acc, s);
    if (threadIdx.x == 0) out[0] = total;
}
"#,
};

/// The line fit `p = w*x + b` against targets `t`: residuals
/// `r = w*x + b - t`, and per block the partial sums of `r*x`, `r` and
/// `r*r` (three floats per block).
pub const LINE: ModuleSource = ModuleSource {
    name: "line",
    kernels: &["line_partials"],
    source: r#"
#define THREADS 256
extern "C" __global__ void line_partials(int n, const float* x, const float* t,
                                         const float* params, float* partial) {
    __shared__ float s[3][THREADS];
    float w = params[0], b = params[1];
    float rx = 0.0f, r1 = 0.0f, rr = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        float r = w * x[i] + b - t[i];
        rx += r * x[i];
        r1 += r;
        rr += r * r;
    }
    s[0][threadIdx.x] = rx;
    s[1][threadIdx.x] = r1;
    s[2][threadIdx.x] = rr;
    __syncthreads();
    for (int k = THREADS / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k)
            for (int j = 0; j < 3; ++j) s[j][threadIdx.x] += s[j][threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x < 3) partial[3 * blockIdx.x + threadIdx.x] = s[threadIdx.x][0];
}
"#,
};

/// One block: the mean squared error `L = mean(r^2)` and its gradients
/// `dL/dw = 2 mean(r x)`, `dL/db = 2 mean(r)` from `blocks` partials, then
/// `w -= lr dL/dw`, `b -= lr dL/db`. `loss` gets the loss of the
/// parameters before the update.
pub const SGD: ModuleSource = ModuleSource {
    name: "sgd",
    kernels: &["line_update"],
    source: r#"
#define THREADS 256
extern "C" __global__ void line_update(int blocks, int n, float lr, const float* partial,
                                       float* params, float* loss) {
    __shared__ float s[3][THREADS];
    float acc[3] = {0.0f, 0.0f, 0.0f};
    for (int i = threadIdx.x; i < blocks; i += blockDim.x)
        for (int j = 0; j < 3; ++j) acc[j] += partial[3 * i + j];
    for (int j = 0; j < 3; ++j) s[j][threadIdx.x] = acc[j];
    __syncthreads();
    for (int k = THREADS / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k)
            for (int j = 0; j < 3; ++j) s[j][threadIdx.x] += s[j][threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        float inv_n = 1.0f / (float)n;
        loss[0] = s[2][0] * inv_n;
        params[0] -= lr * 2.0f * s[0][0] * inv_n;
        params[1] -= lr * 2.0f * s[1][0] * inv_n;
    }
}
"#,
};

/// Every module, in the order a pre-warm loads them.
pub const MODULES: &[ModuleSource] = &[AXPY, LINE, SGD];

/// The architecture on the `.target` line of a PTX text (`sm_90` for
/// PTX compiled for `compute_90`).
pub fn ptx_target(ptx: &str) -> Option<&str> {
    ptx.lines()
        .find_map(|line| line.trim().strip_prefix(".target "))
        .and_then(|rest| rest.split([',', ' ']).next())
}

/// The blocks of a grid-stride launch over `n` elements.
pub fn blocks_for(n: usize) -> u32 {
    let wanted = n.div_ceil(THREADS as usize).max(1);
    u32::try_from(wanted).unwrap_or(MAX_BLOCKS).min(MAX_BLOCKS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_line_of_ptx_is_read() {
        let ptx = "//\n.version 9.0\n.target sm_90\n.address_size 64\n";
        assert_eq!(ptx_target(ptx), Some("sm_90"));
        assert_eq!(ptx_target(".target sm_75, debug\n"), Some("sm_75"));
        assert_eq!(ptx_target(".version 9.0\n"), None);
    }

    #[test]
    fn grids_cover_n_and_stay_capped() {
        assert_eq!(blocks_for(0), 1);
        assert_eq!(blocks_for(256), 1);
        assert_eq!(blocks_for(257), 2);
        assert_eq!(blocks_for(1 << 30), MAX_BLOCKS);
    }
}
