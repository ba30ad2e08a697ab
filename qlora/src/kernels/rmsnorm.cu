// RMSNorm over the last dimension, row-major x [rows, hidden], gamma [hidden].
//
//   forward:  r = 1 / sqrt(mean_i(x_i^2) + eps),  y_i = x_i * r * gamma_i
//   backward: u_i = dy_i * gamma_i
//             dx_i = r * u_i - x_i * r^3 * <u, x> / hidden
//             dgamma_i = sum_rows dy_i * x_i * r
//
// The forward and backward hold a row in registers: thread t owns the packs
// of four columns j = t + k * blockDim.x (k < P: RMS_PACKS = 4 in the
// forward, 1 or 8 in the backward), so each value is read from memory once,
// as one float4 when the row allows it. blockDim.x is a multiple of 32, at
// most 1024, and 4 * P * blockDim.x >= hidden (the launcher picks it). Row reductions are a warp shuffle then one warp
// over the per-warp partials.
//
// dgamma is reduced deterministically, in a fixed order independent of
// scheduling: the backward's block c handles a fixed chunk of rows in row
// order and writes, for each column, its chunk's partial sum; a final kernel
// sums the chunk partials in a fixed tree. No atomics. The training step
// defers that final sum: each norm's backward writes its partials to a
// region of its own, and one launch after the whole backward sums every
// norm's (rmsnorm_bwd_dgamma_table_f32), in the same order.
//
// Rows up to 1024 columns wide take the warp-per-row backward instead: a
// warp owns a row (lane l holds packs l + 32 k), so a row's two sums are
// warp shuffles with no block barrier, and each lane has up to eight float4
// loads of each input in flight.
//
// One file, seven modules (kernels/mod.rs defines RMS_PART for each), so a
// configuration compiles only what it runs and the parallel cold pre-warm
// waits on no large module:
//   RMS_PART 0   rmsnorm            the f32 forwards;
//   RMS_PART 2   rmsnorm_bf16       the bf16 step's forwards
//                                   (rmsnorm_fwd_f32_bf16 also writes the
//                                   output's bf16 rounding, rmsnorm_fwd_bf16
//                                   only that);
//   RMS_PART 32  rmsnorm_bwd_warpP  the warp-per-row backward with P packs a
//                                   lane (RMS_WARP_PACKS: 1, 2, 4 or 8) and
//                                   the dgamma finals (one norm, or a table
//                                   of them);
//   RMS_PART 1   rmsnorm_bwd_block  the one-pack backward and the finals;
//   RMS_PART 8   rmsnorm_bwd_wide   the eight-pack backward and the finals.

#define RMS_PACKS 4

// Pack j of a row: columns 4j .. 4j+3, zero past the row's end. `vec` says the
// row is 16-byte aligned and hidden % 4 == 0, so the pack is one float4.
__device__ __forceinline__ float4 load_pack(const float* p, int j, int hidden, bool vec) {
    if (vec) return reinterpret_cast<const float4*>(p)[j];
    const int c = 4 * j;
    return make_float4(c < hidden ? p[c] : 0.0f, c + 1 < hidden ? p[c + 1] : 0.0f,
                       c + 2 < hidden ? p[c + 2] : 0.0f, c + 3 < hidden ? p[c + 3] : 0.0f);
}

// Stores pack j into row p as S stores it: f32, or its bf16 rounding (the
// bf16 step's GEMM operand). `vec` as for load_pack; a bf16 row is then
// 8-byte aligned.
template <typename S = StoreF32>
__device__ __forceinline__ void store_pack(typename S::T* p, int j, int hidden, bool vec, float4 v) {
    if (vec) {
        S::put4(p, j, v.x, v.y, v.z, v.w);
        return;
    }
    const int c = 4 * j;
    if (c < hidden) S::put(p, c, v.x);
    if (c + 1 < hidden) S::put(p, c + 1, v.y);
    if (c + 2 < hidden) S::put(p, c + 2, v.z);
    if (c + 3 < hidden) S::put(p, c + 3, v.w);
}

__device__ __forceinline__ float dot4(float4 a, float4 b) {
    return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

// The pack index of this thread's k-th pack, or -1 past the row.
__device__ __forceinline__ int pack_index(int k, int packs) {
    const int j = k * blockDim.x + threadIdx.x;
    return j < packs ? j : -1;
}

#if RMS_PART == 0 || RMS_PART == 2

// y = rmsnorm(x) * gamma for rows [0, rows) in f32 (F32) and in its bf16
// rounding y16 (BF16: the same f32 values, rounded at the store); block b
// takes rows b, b + gridDim.x, ... (one row per block, except under the
// test-only serialised launch, which runs one block). A non-null x_copy
// takes a copy of x, from the values already loaded: the bf16 step's next
// residual stream, which its GEMM then adds onto (no copy of its own).
template <bool F32, bool BF16>
__device__ __forceinline__ void rmsnorm_fwd(const float* __restrict__ x,
                                            const float* __restrict__ gamma,
                                            float* __restrict__ y,
                                            unsigned short* __restrict__ y16,
                                            float* __restrict__ x_copy,
                                            int rows, int hidden, float eps) {
    const int packs = (hidden + 3) / 4;
    for (int row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* xr = x + (size_t)row * hidden;
        float* yr = F32 ? y + (size_t)row * hidden : nullptr;
        unsigned short* yr16 = BF16 ? y16 + (size_t)row * hidden : nullptr;
        float* cr = x_copy ? x_copy + (size_t)row * hidden : nullptr;
        const bool vec = hidden % 4 == 0 && aligned16(xr) && (!F32 || aligned16(yr)) &&
                         aligned16(gamma) && (!BF16 || ((unsigned long long)yr16 & 7ull) == 0) &&
                         (!cr || aligned16(cr));
        float4 xv[RMS_PACKS];
        float ss = 0.0f;
        #pragma unroll
        for (int k = 0; k < RMS_PACKS; ++k) {
            const int j = pack_index(k, packs);
            xv[k] = j >= 0 ? load_pack(xr, j, hidden, vec) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            ss += dot4(xv[k], xv[k]);
        }
        ss = block_sum(ss);
        const float r = 1.0f / sqrtf(ss / (float)hidden + eps);
        #pragma unroll
        for (int k = 0; k < RMS_PACKS; ++k) {
            const int j = pack_index(k, packs);
            if (j < 0) continue;
            const float4 g = load_pack(gamma, j, hidden, vec);
            const float4 v = xv[k];
            const float4 out =
                make_float4(v.x * r * g.x, v.y * r * g.y, v.z * r * g.z, v.w * r * g.w);
            if (F32) store_pack(yr, j, hidden, vec, out);
            if (BF16) store_pack<StoreBf16>(yr16, j, hidden, vec, out);
            if (cr) store_pack(cr, j, hidden, vec, v);
        }
    }
}

#if RMS_PART == 0
extern "C" __global__ void rmsnorm_fwd_f32(const float* __restrict__ x,
                                           const float* __restrict__ gamma,
                                           float* __restrict__ y,
                                           int rows, int hidden, float eps) {
    rmsnorm_fwd<true, false>(x, gamma, y, nullptr, nullptr, rows, hidden, eps);
}
#else  // RMS_PART 2, a module of its own: compiled beside the f32 one, and
       // only for a step that computes in bf16

// With x_copy (null for none) as rmsnorm_fwd says.
extern "C" __global__ void rmsnorm_fwd_f32_bf16(const float* __restrict__ x,
                                                const float* __restrict__ gamma,
                                                float* __restrict__ y,
                                                unsigned short* __restrict__ y16,
                                                float* __restrict__ x_copy,
                                                int rows, int hidden, float eps) {
    rmsnorm_fwd<true, true>(x, gamma, y, y16, x_copy, rows, hidden, eps);
}

// Only y's bf16 rounding: the forward of a norm whose f32 output nothing
// reads (a bf16 step's MLP norm, whose backward needs x2 and its rounding).
extern "C" __global__ void rmsnorm_fwd_bf16(const float* __restrict__ x,
                                            const float* __restrict__ gamma,
                                            unsigned short* __restrict__ y16,
                                            float* __restrict__ x_copy,
                                            int rows, int hidden, float eps) {
    rmsnorm_fwd<false, true>(x, gamma, nullptr, y16, x_copy, rows, hidden, eps);
}
#endif

#if RMS_PART == 0
// Fused residual add + RMSNorm: h = a + b (the new residual stream, stored),
// y = rmsnorm(h) * gamma. Reads a and b once instead of writing h and reading
// it back in a separate normalisation pass.
extern "C" __global__ void rmsnorm_residual_fwd_f32(const float* __restrict__ a,
                                                    const float* __restrict__ b,
                                                    const float* __restrict__ gamma,
                                                    float* __restrict__ h,
                                                    float* __restrict__ y,
                                                    int rows, int hidden, float eps) {
    const int row = blockIdx.x;
    if (row >= rows) return;
    const size_t base = (size_t)row * hidden;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float v = a[base + i] + b[base + i];
        h[base + i] = v;
        ss += v * v;
    }
    ss = block_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)hidden + eps);
    // Each thread re-reads only the h elements it wrote itself.
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) y[base + i] = h[base + i] * r * gamma[i];
}
#endif

#else  // the backward parts

// (sum of a, sum of b) over the threads of this thread's row group (those
// with its threadIdx.y: blockDim.x threads, a multiple of 32), in one pass of
// shuffles and barriers; every thread gets both. Each thread sums its group's
// per-warp partials in warp order: a fixed order, reproducible bit for bit.
// Every thread of the block must call it (it has block barriers).
__device__ float2 group_sum2(float a, float b) {
    __shared__ float2 partial[32];
    const int tid = threadIdx.y * blockDim.x + threadIdx.x;
    const int warps_per_group = blockDim.x >> 5;
    a = warp_reduce(a, SumOp());
    b = warp_reduce(b, SumOp());
    if ((tid & 31) == 0) partial[tid >> 5] = make_float2(a, b);
    __syncthreads();
    float2 out = make_float2(0.0f, 0.0f);
    const int first = threadIdx.y * warps_per_group;
    for (int w = 0; w < warps_per_group; ++w) {
        out.x += partial[first + w].x;
        out.y += partial[first + w].y;
    }
    __syncthreads();  // `partial` may be rewritten by the next call
    return out;
}

// Pack j of a row's dx, r * dy * gamma - x * proj (proj = r^3 <u, x> / hidden),
// added onto `old` (the pack's earlier value, the residual stream's gradient)
// when given, as old + dx; stored, and with dx16r also its bf16 rounding
// (nearest, ties to even); the pack's dgamma terms dy * x * r added to acc.
__device__ __forceinline__ void bwd_pack(float* dxr, unsigned short* dx16r, int j, int hidden,
                                         bool vec, float4 v, float4 d, float4 g, float r,
                                         float proj, const float4* old, float4& acc) {
    float4 o = make_float4(r * d.x * g.x - v.x * proj, r * d.y * g.y - v.y * proj,
                           r * d.z * g.z - v.z * proj, r * d.w * g.w - v.w * proj);
    if (old) o = make_float4(old->x + o.x, old->y + o.y, old->z + o.z, old->w + o.w);
    store_pack(dxr, j, hidden, vec, o);
    if (dx16r) store_pack<StoreBf16>(dx16r, j, hidden, vec, o);
    acc.x += d.x * v.x * r;
    acc.y += d.y * v.y * r;
    acc.z += d.z * v.z * r;
    acc.w += d.w * v.w * r;
}

// The row `base` of dx16, or null without one.
__device__ __forceinline__ unsigned short* row16(unsigned short* dx16, size_t base) {
    return dx16 ? dx16 + base : nullptr;
}

// One chunk of the backward: rows [r0, r1), its dgamma partial into
// `partial` [hidden]. The block's blockDim.y row groups take rows r0 + y,
// r0 + y + blockDim.y, ... in parallel, each thread holding P packs of its
// row; at the end the groups' dgamma sums are added in group order (row
// order within the chunk's steps is then: all steps of group 0, of group 1,
// ...: fixed, so reproducible). blockDim.y > 1 only with P == 1.
template <int P>
__device__ void rmsnorm_bwd_chunk(const float* __restrict__ x, const float* __restrict__ gamma,
                                  const float* __restrict__ dy, float* __restrict__ dx,
                                  unsigned short* __restrict__ dx16, bool onto,
                                  float* __restrict__ partial, int r0, int r1, int hidden,
                                  float eps, int packs, bool vec) {
    __shared__ float4 group_acc[1024];
    const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 gv[P];
    float4 acc[P];
    #pragma unroll
    for (int k = 0; k < P; ++k) {
        const int j = pack_index(k, packs);
        gv[k] = j >= 0 ? load_pack(gamma, j, hidden, vec) : z;
        acc[k] = z;
    }
    const int steps = (r1 - r0 + blockDim.y - 1) / blockDim.y;  // uniform per block
    for (int s = 0; s < steps; ++s) {
        const int row = r0 + s * blockDim.y + threadIdx.y;
        const bool live = row < r1;
        const size_t base = (size_t)(live ? row : r0) * hidden;
        float4 xv[P];
        float4 dv[P];
        float ss = 0.0f;
        float dot = 0.0f;  // <dy * gamma, x>
        #pragma unroll
        for (int k = 0; k < P; ++k) {
            const int j = live ? pack_index(k, packs) : -1;
            xv[k] = j >= 0 ? load_pack(x + base, j, hidden, vec) : z;
            dv[k] = j >= 0 ? load_pack(dy + base, j, hidden, vec) : z;
            ss += dot4(xv[k], xv[k]);
            const float4 u = make_float4(dv[k].x * gv[k].x, dv[k].y * gv[k].y,
                                         dv[k].z * gv[k].z, dv[k].w * gv[k].w);
            dot += dot4(u, xv[k]);
        }
        const float2 sums = group_sum2(ss, dot);
        if (!live) continue;
        const float r = 1.0f / sqrtf(sums.x / (float)hidden + eps);
        const float proj = r * r * r * sums.y / (float)hidden;
        #pragma unroll
        for (int k = 0; k < P; ++k) {
            const int j = pack_index(k, packs);
            if (j < 0) continue;
            const float4 old = onto ? load_pack(dx + base, j, hidden, vec) : z;
            bwd_pack(dx + base, row16(dx16, base), j, hidden, vec, xv[k], dv[k], gv[k], r, proj,
                     onto ? &old : nullptr, acc[k]);
        }
    }
    if (blockDim.y > 1) {
        // P == 1: one pack per thread; group 0 adds the groups' sums in order.
        group_acc[threadIdx.y * blockDim.x + threadIdx.x] = acc[0];
        __syncthreads();
        if (threadIdx.y == 0) {
            float4 t = z;
            for (int y = 0; y < (int)blockDim.y; ++y) {
                const float4 v = group_acc[y * blockDim.x + threadIdx.x];
                t.x += v.x;
                t.y += v.y;
                t.z += v.z;
                t.w += v.w;
            }
            acc[0] = t;
        }
        __syncthreads();  // group_acc may be rewritten by the next chunk
    }
    if (threadIdx.y != 0) return;
    #pragma unroll
    for (int k = 0; k < P; ++k) {
        const int j = pack_index(k, packs);
        if (j >= 0) store_pack(partial, j, hidden, vec, acc[k]);
    }
}

// dx for rows [0, rows), and partials[c * hidden + i] = sum over the rows of
// chunk c ([c * rows_per_chunk, min(rows, (c+1) * rows_per_chunk)), in row
// order) of dy[row, i] * x[row, i] * r_row. One block per chunk; x and dy are
// read once, each row's values held in registers between its reduction and
// its dx, and the chunk's dgamma partial accumulates in registers. Block b
// takes chunks b, b + gridDim.x, ... (one each, except under the test-only
// serialised launch, which runs one block). Each thread holds P packs, so
// 4 * P * blockDim.x >= hidden; the bounds keep P's registers within the SM.
// With `onto` each row's dx is added onto what dx holds (dx += rmsnorm'(dy):
// the step's residual gradient, without a separate accumulate pass); with
// dx16 (else null) the stored values' bf16 rounding goes there too.
template <int P>
__device__ void rmsnorm_bwd(const float* __restrict__ x, const float* __restrict__ gamma,
                            const float* __restrict__ dy, float* __restrict__ dx,
                            float* __restrict__ partials, int rows, int hidden, float eps,
                            int rows_per_chunk, int chunks, int onto,
                            unsigned short* __restrict__ dx16) {
    const int packs = (hidden + 3) / 4;
    const bool vec = hidden % 4 == 0 && aligned16(x) && aligned16(dy) && aligned16(dx) &&
                     aligned16(gamma) && aligned16(partials) &&
                     (!dx16 || StoreBf16::vec(dx16));
    for (int c = blockIdx.x; c < chunks; c += gridDim.x) {
        rmsnorm_bwd_chunk<P>(x, gamma, dy, dx, dx16, onto != 0, partials + (size_t)c * hidden,
                             c * rows_per_chunk, min(rows, (c + 1) * rows_per_chunk), hidden,
                             eps, packs, vec);
    }
}

#if RMS_PART == 32
// The warp-per-row backward, rows of up to 4 * 32 * P columns: warp w of the
// block (threadIdx.y; blockDim is 32 x W, W <= WARP_ROWS_MAX) takes rows
// r0 + w, r0 + w + W, ... of its chunk; lane l holds packs l + 32 k, k < P.
// Each warp sums its rows' dgamma terms in row order, then the W warps' sums
// are added in warp order into the chunk's partial: a fixed order.
#define WARP_ROWS_MAX 8
template <int P>
__device__ void rmsnorm_bwd_warp(const float* __restrict__ x, const float* __restrict__ gamma,
                                 const float* __restrict__ dy, float* __restrict__ dx,
                                 float* __restrict__ partials, int rows, int hidden, float eps,
                                 int rows_per_chunk, int chunks, int onto,
                                 unsigned short* __restrict__ dx16) {
    __shared__ float4 warp_acc[WARP_ROWS_MAX * 32 * P];
    const int lane = threadIdx.x;
    const int w = threadIdx.y;
    const int packs = (hidden + 3) / 4;
    // Packs only: the launcher runs these builds on rows with hidden % 4 == 0
    // and every buffer 16-byte aligned, dx16 8-byte (ops/rmsnorm.rs), other rows on the
    // row-group builds. Without the scalar path the module compiles in half
    // the time, and it is on the cold pre-warm's critical path.
    const bool vec = true;
    const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 gv[P];
    #pragma unroll
    for (int k = 0; k < P; ++k) {
        const int j = lane + 32 * k;
        gv[k] = j < packs ? load_pack(gamma, j, hidden, vec) : z;
    }
    for (int c = blockIdx.x; c < chunks; c += gridDim.x) {
        const int r1 = min(rows, (c + 1) * rows_per_chunk);
        float4 acc[P];
        #pragma unroll
        for (int k = 0; k < P; ++k) acc[k] = z;
        for (int row = c * rows_per_chunk + w; row < r1; row += blockDim.y) {
            const size_t base = (size_t)row * hidden;
            float4 xv[P], dv[P], ov[P];
            #pragma unroll
            for (int k = 0; k < P; ++k) {  // every load issued before any is used
                const int j = lane + 32 * k;
                xv[k] = j < packs ? load_pack(x + base, j, hidden, vec) : z;
                dv[k] = j < packs ? load_pack(dy + base, j, hidden, vec) : z;
                ov[k] = onto && j < packs ? load_pack(dx + base, j, hidden, vec) : z;
            }
            float ss = 0.0f;
            float dot = 0.0f;  // <dy * gamma, x>
            #pragma unroll
            for (int k = 0; k < P; ++k) {
                ss += dot4(xv[k], xv[k]);
                const float4 u = make_float4(dv[k].x * gv[k].x, dv[k].y * gv[k].y,
                                             dv[k].z * gv[k].z, dv[k].w * gv[k].w);
                dot += dot4(u, xv[k]);
            }
            ss = warp_reduce(ss, SumOp());
            dot = warp_reduce(dot, SumOp());
            const float r = 1.0f / sqrtf(ss / (float)hidden + eps);
            const float proj = r * r * r * dot / (float)hidden;
            #pragma unroll
            for (int k = 0; k < P; ++k) {
                const int j = lane + 32 * k;
                if (j >= packs) continue;
                bwd_pack(dx + base, row16(dx16, base), j, hidden, vec, xv[k], dv[k], gv[k], r,
                         proj, onto ? &ov[k] : nullptr, acc[k]);
            }
        }
        // warp_acc[w][j]: warp w's sum for pack j = lane + 32 k.
        #pragma unroll
        for (int k = 0; k < P; ++k) warp_acc[w * 32 * P + 32 * k + lane] = acc[k];
        __syncthreads();
        float* partial = partials + (size_t)c * hidden;
        for (int j = w * 32 + lane; j < packs; j += blockDim.y * 32) {
            float4 t = z;
            for (int ww = 0; ww < (int)blockDim.y; ++ww) {
                const float4 v = warp_acc[ww * 32 * P + j];
                t.x += v.x;
                t.y += v.y;
                t.z += v.z;
                t.w += v.w;
            }
            store_pack(partial, j, hidden, vec, t);
        }
        __syncthreads();  // warp_acc is rewritten for the next chunk
    }
}

#define RMSNORM_BWD_WARP(P)                                                                     \
    extern "C" __global__ void __launch_bounds__(WARP_ROWS_MAX * 32) rmsnorm_bwd_warp##P##_f32( \
        const float* __restrict__ x, const float* __restrict__ gamma,                           \
        const float* __restrict__ dy, float* __restrict__ dx, float* __restrict__ partials,      \
        int rows, int hidden, float eps, int rows_per_chunk, int chunks, int onto,              \
        unsigned short* __restrict__ dx16) {                                                    \
        rmsnorm_bwd_warp<P>(x, gamma, dy, dx, partials, rows, hidden, eps, rows_per_chunk,      \
                            chunks, onto, dx16);                                                \
    }
// One build per module (RMS_WARP_PACKS from kernels/mod.rs): each compiles
// alone, so the cold pre-warm waits on no module of all four.
#if RMS_WARP_PACKS == 1
RMSNORM_BWD_WARP(1)
#elif RMS_WARP_PACKS == 2
RMSNORM_BWD_WARP(2)
#elif RMS_WARP_PACKS == 4
RMSNORM_BWD_WARP(4)
#elif RMS_WARP_PACKS == 8
RMSNORM_BWD_WARP(8)
#else
#error "RMS_WARP_PACKS must be 1, 2, 4 or 8"
#endif

#elif RMS_PART == 1
// Rows of up to 4 * 1024 columns: one pack per thread, blockDim.y rows of a
// chunk at a time.
extern "C" __global__ void __launch_bounds__(1024) rmsnorm_bwd_f32(
    const float* __restrict__ x, const float* __restrict__ gamma, const float* __restrict__ dy,
    float* __restrict__ dx, float* __restrict__ partials, int rows, int hidden, float eps,
    int rows_per_chunk, int chunks, int onto, unsigned short* __restrict__ dx16) {
    rmsnorm_bwd<1>(x, gamma, dy, dx, partials, rows, hidden, eps, rows_per_chunk, chunks, onto,
                    dx16);
}

#elif RMS_PART == 8
// Wider rows, up to 8 * 4 * 256 columns: eight packs per thread, one row at
// a time (blockDim.y = 1).
extern "C" __global__ void __launch_bounds__(256) rmsnorm_bwd_wide_f32(
    const float* __restrict__ x, const float* __restrict__ gamma, const float* __restrict__ dy,
    float* __restrict__ dx, float* __restrict__ partials, int rows, int hidden, float eps,
    int rows_per_chunk, int chunks, int onto, unsigned short* __restrict__ dx16) {
    rmsnorm_bwd<8>(x, gamma, dy, dx, partials, rows, hidden, eps, rows_per_chunk, chunks, onto,
                    dx16);
}

#else
#error "RMS_PART must be 0, 1, 8 or 32"
#endif

// dgamma[i] = sum_{c < chunks} partials[c * hidden + i], for i < n_write.
// Block of 32 x 32 threads over 32 columns: thread (col, g) sums chunks
// g, g + 32, ... in order, its loads issued together (a warp reads 32
// adjacent columns: one line); then thread g = 0 adds the 32 group sums in
// order. A fixed order: bit-for-bit reproducible.
#define DGAMMA_GROUPS 32
__device__ __forceinline__ void dgamma_sum(const float* __restrict__ partials,
                                           float* __restrict__ dgamma, int hidden, int chunks,
                                           int n_write) {
    __shared__ float group[DGAMMA_GROUPS][33];
    const int col = blockIdx.x * 32 + threadIdx.x;
    const int g = threadIdx.y;
    float acc = 0.0f;
    if (col < hidden) {
        for (int c0 = g; c0 < chunks; c0 += 8 * DGAMMA_GROUPS) {
            float v[8];
            #pragma unroll
            for (int u = 0; u < 8; ++u) {
                const int c = c0 + u * DGAMMA_GROUPS;
                v[u] = c < chunks ? partials[(size_t)c * hidden + col] : 0.0f;
            }
            #pragma unroll
            for (int u = 0; u < 8; ++u) acc += v[u];
        }
    }
    group[g][threadIdx.x] = acc;
    __syncthreads();
    if (g != 0 || col >= hidden || col >= n_write) return;
    float total = 0.0f;
    for (int k = 0; k < DGAMMA_GROUPS; ++k) total += group[k][threadIdx.x];
    dgamma[col] = total;
}

extern "C" __global__ void rmsnorm_bwd_dgamma_final_f32(const float* __restrict__ partials,
                                                        float* __restrict__ dgamma,
                                                        int hidden, int chunks, int n_write) {
    // Launched as the backward's programmatic dependent: the partials are
    // read only once the backward has finished and its writes are visible.
    wait_for_predecessor();
    dgamma_sum(partials, dgamma, hidden, chunks, n_write);
}

// The same sum for several norms of one shape at once, the training step's
// after its whole backward: norm n's partials are the n-th [chunks, hidden]
// block of `partials`, its sum goes to the tensor at address dgammas[n], and
// block row y takes norms y * DGAMMA_NORMS + s for s < DGAMMA_NORMS (those
// below `slots`), their loads in flight together. Each norm's sum is the one
// rmsnorm_bwd_dgamma_final_f32 computes, in the same order: thread (col, g)
// sums its chunks g, g + 32, ... in order, then warp s adds norm s's 32
// group sums in order.
#define DGAMMA_NORMS 8
extern "C" __global__ void __launch_bounds__(32 * DGAMMA_GROUPS) rmsnorm_bwd_dgamma_table_f32(
    const float* __restrict__ partials, const unsigned long long* __restrict__ dgammas,
    int hidden, int chunks, int slots) {
    __shared__ float group[DGAMMA_NORMS][DGAMMA_GROUPS][33];
    const int col = blockIdx.x * 32 + threadIdx.x;
    const int g = threadIdx.y;
    const int first = blockIdx.y * DGAMMA_NORMS;
    float acc[DGAMMA_NORMS];
#pragma unroll
    for (int s = 0; s < DGAMMA_NORMS; ++s) acc[s] = 0.0f;
    if (col < hidden) {
        // Four chunks a norm a trip (128 chunks, the step's, are one trip):
        // the order of the sums is the same for any number.
        for (int c0 = g; c0 < chunks; c0 += 4 * DGAMMA_GROUPS) {
            float v[DGAMMA_NORMS][4];
#pragma unroll
            for (int s = 0; s < DGAMMA_NORMS; ++s)
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int c = c0 + u * DGAMMA_GROUPS;
                    v[s][u] = first + s < slots && c < chunks
                                  ? partials[((size_t)(first + s) * chunks + c) * hidden + col]
                                  : 0.0f;
                }
#pragma unroll
            for (int s = 0; s < DGAMMA_NORMS; ++s)
#pragma unroll
                for (int u = 0; u < 4; ++u) acc[s] += v[s][u];
        }
    }
#pragma unroll
    for (int s = 0; s < DGAMMA_NORMS; ++s) group[s][g][threadIdx.x] = acc[s];
    __syncthreads();
    const int n = first + g;
    if (g >= DGAMMA_NORMS || n >= slots || col >= hidden) return;
    float total = 0.0f;
    for (int k = 0; k < DGAMMA_GROUPS; ++k) total += group[g][k][threadIdx.x];
    reinterpret_cast<float*>(dgammas[n])[col] = total;
}

#endif  // RMS_PART
