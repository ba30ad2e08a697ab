// Helpers of the GPU training step that keep all step state on the device, so
// that a step captured as a CUDA graph can be replayed unchanged:
//
//   adamw_multi_devt_f32    AdamW as in adamw.cu (adamw_1, adamw_powi from
//                           common.cuh) over every tensor of a table
//                           (gpu/table.rs; columns p, g, m, v, scale) in one
//                           launch, each gradient first multiplied by its
//                           tensor's clip scale (when the scale column is set)
//                           in f32, as clip_apply does; the step number t is
//                           read from device memory (a captured kernel
//                           argument would freeze t at its capture-time value);
//   step_count_advance_i32  t[0] += by, one thread (the graph advances t itself);
//   lora_grads_*            the four LoRA weight gradients of a layer's q and v,
//                           on TF32 tensor cores, in two launches (below).
//
// AdamW with bias correction and decoupled weight decay, for step t >= 1:
//   m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2
//   p -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd p)

extern "C" __global__ void step_count_advance_i32(int* __restrict__ step, int by) {
    if (blockIdx.x == 0 && threadIdx.x == 0) step[0] += by;
}

extern "C" __global__ void adamw_multi_devt_f32(const unsigned long long* __restrict__ ptrs,
                                                const long long* __restrict__ offsets,
                                                int n_tensors, const int* __restrict__ step,
                                                float lr, float beta1, float beta2, float eps,
                                                float weight_decay) {
    const int t = step[0];
    const float c1 = (float)(1.0 - adamw_powi((double)beta1, t));
    const float c2 = (float)(1.0 - adamw_powi((double)beta2, t));
    const long long total = offsets[n_tensors];
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += stride) {
        const int i = table_find(offsets, n_tensors, k);
        const long long e = k - offsets[i];
        float* p = reinterpret_cast<float*>(ptrs[i]);
        const float* g = reinterpret_cast<const float*>(ptrs[n_tensors + i]);
        float* m = reinterpret_cast<float*>(ptrs[2 * n_tensors + i]);
        float* v = reinterpret_cast<float*>(ptrs[3 * n_tensors + i]);
        const float* scale = reinterpret_cast<const float*>(ptrs[4 * n_tensors + i]);
        float gk = g[e];
        if (scale != nullptr) gk *= scale[0];
        p[e] = adamw_1(p[e], gk, m[e], v[e], c1, c2, lr, beta1, beta2, eps, weight_decay);
    }
}

// The LoRA weight gradients of one layer's q and v, from the LoRA
// down-projections u = [uq | uv] ([rows, 2 r]: the columns of the fused
// projection's output y = n1 S^T past q | k | v), the gradient of that output
// dy ([rows, width], columns q | k | v | uq | uv, width = q_dim + 2 kv_dim +
// 2 r) and the norm's output n1 ([rows, hidden]):
//   dBq = s dy[:, q]^T uq   [q_dim, r]        dAq = duq^T n1   [r, hidden]
//   dBv = s dy[:, v]^T uv   [kv_dim, r]       dAv = duv^T n1   [r, hidden]
// (duq, duv already carry s: the q/k/v epilogue's backward wrote them). Each is
// out[o][j] = scale sum_t wide[t][o] narrow[t][j] over the rows t, on TF32
// tensor cores (mma m16n8k8: operands rounded to tf32, f32 accumulation), as
// cuBLAS computes them in TF32 math, in two kernels:
//   lora_grads_partial_tf32  a warp takes one tile of LORA_M columns o of one
//                            product (the tiles numbered across the four
//                            products: dBq's, dBv's, dAq's, dAv's) and all
//                            r <= LORA_RANKS columns j, over one slice of
//                            LORA_SLICE rows; a block's warps take adjacent
//                            tiles, so the block reads its rows' columns in
//                            runs of LORA_WARPS * LORA_M;
//   lora_grads_final_f32     adds each output's slices in slice order, times
//                            scale (a programmatic dependent of the first).
// The same result on every run: no atomics, every sum in a fixed order.
#define LORA_M 16
#define LORA_RANKS 16
#define LORA_WARPS 8
#define LORA_SLICE 64
#define LORA_TILE (LORA_M * LORA_RANKS)

struct LoraProduct {
    const float* wide;
    int ld_wide;
    int wide_cols;
    const float* narrow;
    int ld_narrow;
    float* out;
    int out_stride_o;     // out[o * out_stride_o + j * out_stride_j]
    int out_stride_j;
    float scale;
    int tile;             // the tile of LORA_M columns within the product
};

// The product and column tile of tile `b`: dBq's tiles first, then dBv's,
// dAq's and dAv's.
static __device__ LoraProduct lora_product(int b, const float* u, const float* dy, const float* n1,
                                           float* dbq, float* dbv, float* daq, float* dav,
                                           int hidden, int q_dim, int kv_dim, int r, float s) {
    const int width = q_dim + 2 * kv_dim + 2 * r;
    const int u_col = q_dim + 2 * kv_dim;
    const int tq = (q_dim + LORA_M - 1) / LORA_M;
    const int tv = (kv_dim + LORA_M - 1) / LORA_M;
    const int th = (hidden + LORA_M - 1) / LORA_M;
    if (b < tq) return {dy, width, q_dim, u, 2 * r, dbq, r, 1, s, b};
    b -= tq;
    if (b < tv) return {dy + q_dim + kv_dim, width, kv_dim, u + r, 2 * r, dbv, r, 1, s, b};
    b -= tv;
    if (b < th) return {n1, hidden, hidden, dy + u_col, width, daq, 1, hidden, 1.0f, b};
    return {n1, hidden, hidden, dy + u_col + r, width, dav, 1, hidden, 1.0f, b - th};
}

// wide[t][o] (zero outside the operand), rounded to tf32.
static __device__ __forceinline__ float lora_wide(const LoraProduct& p, int rows, int t, int o) {
    return (t < rows && o < p.wide_cols) ? tc_tf32(p.wide[(size_t)t * p.ld_wide + o]) : 0.0f;
}

// narrow[t][j] (zero outside the operand), rounded to tf32.
static __device__ __forceinline__ float lora_narrow(const LoraProduct& p, int rows, int r, int t,
                                                    int j) {
    return (t < rows && j < r) ? tc_tf32(p.narrow[(size_t)t * p.ld_narrow + j]) : 0.0f;
}

extern "C" __global__ void __launch_bounds__(LORA_WARPS * 32)
lora_grads_partial_tf32(const float* __restrict__ u, const float* __restrict__ dy,
                        const float* __restrict__ n1, float* __restrict__ partials, int tiles,
                        int rows, int hidden, int q_dim, int kv_dim, int r) {
#if __CUDA_ARCH__ >= 800
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int tile = blockIdx.x * LORA_WARPS + warp;
    if (tile >= tiles) return;
    const LoraProduct p = lora_product(tile, u, dy, n1, nullptr, nullptr, nullptr, nullptr, hidden,
                                       q_dim, kv_dim, r, 1.0f);
    const int g = lane >> 2, tq = lane & 3;  // mma fragment coordinates
    const int o0 = p.tile * LORA_M;
    // acc[n]: the 16 x 8 tile of ranks 8n..8n+7; this lane holds rows (o) g
    // and g + 8, columns (j) 2 tq and 2 tq + 1.
    float acc[LORA_RANKS / 8][4] = {};
    const int row0 = blockIdx.y * LORA_SLICE;
#pragma unroll 4
    for (int step = 0; step < LORA_SLICE / 8; ++step) {
        const int ta = row0 + step * 8 + tq, tb = ta + 4;
        // A = wide^T (16 columns o by 8 rows t), B = narrow (8 rows t by 8 ranks j).
        const float a[4] = {lora_wide(p, rows, ta, o0 + g), lora_wide(p, rows, ta, o0 + g + 8),
                            lora_wide(p, rows, tb, o0 + g), lora_wide(p, rows, tb, o0 + g + 8)};
#pragma unroll
        for (int n = 0; n < LORA_RANKS / 8; ++n) {
            const float b0 = lora_narrow(p, rows, r, ta, 8 * n + g);
            const float b1 = lora_narrow(p, rows, r, tb, 8 * n + g);
            tc_mma(acc[n], a, b0, b1);
        }
    }
    float* out = partials + ((size_t)blockIdx.y * tiles + tile) * LORA_TILE;
#pragma unroll
    for (int n = 0; n < LORA_RANKS / 8; ++n) {
        const int j = 8 * n + 2 * tq;
        *reinterpret_cast<float2*>(out + g * LORA_RANKS + j) = make_float2(acc[n][0], acc[n][1]);
        *reinterpret_cast<float2*>(out + (g + 8) * LORA_RANKS + j) =
            make_float2(acc[n][2], acc[n][3]);
    }
#endif
}

// One thread per (tile, o, j) of the partials: out = scale * the sum of its
// `slices` partials in slice order.
extern "C" __global__ void lora_grads_final_f32(const float* __restrict__ partials, int tiles,
                                                int slices, float* __restrict__ dbq,
                                                float* __restrict__ dbv, float* __restrict__ daq,
                                                float* __restrict__ dav, int hidden, int q_dim,
                                                int kv_dim, int r, float s) {
    wait_for_predecessor();
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= tiles * LORA_TILE) return;
    const int tile = k / LORA_TILE, e = k % LORA_TILE;
    const LoraProduct p = lora_product(tile, nullptr, nullptr, nullptr, dbq, dbv, daq, dav, hidden,
                                       q_dim, kv_dim, r, s);
    const int o = p.tile * LORA_M + e / LORA_RANKS, j = e % LORA_RANKS;
    if (j >= r || o >= p.wide_cols) return;
    float sum = 0.0f;
    for (int slice = 0; slice < slices; ++slice) {
        sum += partials[(size_t)slice * tiles * LORA_TILE + k];
    }
    p.out[(size_t)o * p.out_stride_o + (size_t)j * p.out_stride_j] = p.scale * sum;
}
