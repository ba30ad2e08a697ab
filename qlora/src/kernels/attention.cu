// Causal grouped-query attention (GQA), forward and backward, in f32.
//
// Layouts (row-major, as in ops/attention.rs):
//   q, out, dq, dout  [batch, seq, heads, head_dim]
//   k, v, dk, dv      [batch, seq, kv_heads, head_dim]
//   probs             [batch, heads, seq, seq], masked entries (j > i) exactly 0
//   ds                [batch, heads, seq, seq], scratch: only j <= i is meaningful
//   pk, pv            [batch, seq, heads, head_dim], scratch: one query head's
//                     share of dk (before the scale) and of dv
// Query head h reads kv head h / (heads / kv_heads).
//
//   S_ij = scale <q_i, k_j>,  scale = 1 / sqrt(head_dim) (passed in)
//   P_ij = exp(S_ij - m_i) / l_i   for j <= i,  m_i = max_j S_ij,  l_i = sum_j exp(S_ij - m_i)
//   out_i = sum_{j <= i} P_ij v_j
//
// Backward, from the saved P and out:
//   dP_ij = <dout_i, v_j>,   D_i = sum_j P_ij dP_ij = <dout_i, out_i>,   dS_ij = P_ij (dP_ij - D_i)
//   dq_i = scale sum_j dS_ij k_j
//   dk_j = scale sum_{h in group} sum_{i >= j} dS_ij q_i
//   dv_j =       sum_{h in group} sum_{i >= j} P_ij dout_i
//
// The tiled kernels come in two builds: _d64 for head_dim <= 64 and _d128 for
// head_dim <= 128 (rows staged in shared memory are zero-padded to 64 or 128,
// so the inner loops have a compile-time length and no bounds tests). Each
// kernel of each build is its own module (this file with ATT_BUILD and
// ATT_PART defined), so a model compiles only the build its head_dim needs,
// and the three compile in parallel at pre-warm:
//   attention_fwd_dXX      attention_fwd_dXX_f32: out and probs, one pass
//                          over the keys;
//   attention_dq_dXX       attention_bwd_dq_dXX_f32: dS (into ds) and dq;
//   attention_dkv_dXX      attention_bwd_dkv_dXX_f32: each query head's
//                          share of dk and dv (pk, pv), and
//                          attention_bwd_kv_sum_f32: dk, dv, the shares of a
//                          group added in order (not tiled; in both builds).
//   attention_tc_{fwd,dq,dkv}_dXX (ATT_PART 3, 4, 5): the same three on the
//                          tensor cores (TF32 products, f32 accumulation),
//                          same arguments and outputs; see "Tensor-core
//                          kernels" below. The tc dkv module holds kv_sum too.
//   attention_flash_{fwd,dq,dkv}_dXX (ATT_PART 6, 7, 8): bf16 q, k and v,
//                          bf16 products, no probabilities saved (q, k, v
//                          given as bf16 bits); see "bf16 flash kernels"
//                          below; their build for rows in 16-byte pieces
//                          only (the one a model's step takes).
//   attention_flash_dots_dXX (ATT_PART 9): the flash backward's row dots D
//                          and kv_sum.
//   attention_flash_any_dXX (ATT_PART 10): the three flash kernels of the
//                          build for any head_dim and alignment.
//
// Tiling. The tiled kernels run 256 threads on a tile of ATT_ROWS = 32 rows
// (query rows for the forward and dq, key rows for dk/dv): thread (g, c), with
// g = tid / 16 and c = tid % 16, owns rows 2g and 2g + 1 of the tile. The
// other dimension is walked in chunks staged in shared memory; of a chunk of
// keys the thread owns keys c, c + 16, ..., and of a head_dim-wide output row
// it owns columns c, c + 16, ... Two rows per thread make each value read
// from shared memory feed two multiply-adds. The next chunk is loaded into
// registers while the current one is computed, so a chunk costs one memory
// latency at most. Row reductions (max, sum) combine the 16 threads of a row,
// half a warp, with xor shuffles: every thread of the row gets the same value,
// in the same order on every run. Nothing uses atomics, so the results are
// deterministic. Shared-memory rows are padded to an odd length so the
// column-strided reads of a warp hit distinct banks.
//
// The forward is one pass with a running maximum: for each chunk of keys it
// rescales the row's sum l and its output accumulator by exp(m_old - m_new)
// (the online softmax of Milakov & Gimelshein, 2018), and it stores the raw
// scores in probs; a last loop over each thread's own entries turns them into
// probabilities with the final m and l.
//
// `write_limit` exists only so the test-only fault injection "last element
// unwritten" skips real stores (of `out` in the forward, of `dv` in kv_sum);
// it is the output length otherwise.

#define ATT_LANES 16
#define ATT_THREADS 256
#define ATT_ROWS 32
#define ATT_NEG_INF __int_as_float(0xff800000)

// Compile-time shapes of one build: D = padded head_dim.
template <int D>
struct AttShape {
    // Keys per chunk of the forward and dq kernels (smaller at 128 so the
    // shared memory stays under the 48 KiB a launch gets without opting in).
    static constexpr int CHUNK = D <= 64 ? 64 : 32;
    static constexpr int KEYS = CHUNK / ATT_LANES;  // keys of a chunk per thread
    static constexpr int COLS = D / ATT_LANES;      // output columns per thread
    static constexpr int LD = D + 1;                // padded shared-memory row
    static constexpr int QCHUNK = 32;               // query rows per chunk of dk/dv
};

// Max and sum over the 16 lanes of a row (half a warp).
__device__ __forceinline__ float att_row_max(float v) { return warp_reduce<ATT_LANES>(v, MaxOp()); }

__device__ __forceinline__ float att_row_sum(float v) { return warp_reduce<ATT_LANES>(v, SumOp()); }

__device__ __forceinline__ size_t att_q_at(int b, int i, int h, int seq, int heads, int head_dim) {
    return (((size_t)b * seq + i) * heads + h) * head_dim;
}

__device__ __forceinline__ size_t att_kv_at(int b, int j, int kvh, int seq, int kv_heads, int head_dim) {
    return (((size_t)b * seq + j) * kv_heads + kvh) * head_dim;
}

__device__ __forceinline__ size_t att_p_at(int b, int h, int i, int seq, int heads) {
    return (((size_t)b * heads + h) * seq + i) * seq;
}

// ROWS rows of a head_dim-wide tensor, held in registers between a load from
// global memory and a store to shared memory (row n at dst + n * (D + 1)).
// Entries past `valid` rows or past head_dim are zero. Thread t holds the
// entries t, t + 256, ... of the tile in row-major order, so a warp reads
// consecutive floats of a row.
template <int D, int ROWS>
struct AttTile {
    static constexpr int N = ROWS * D / ATT_THREADS;
    float r[N];

    __device__ __forceinline__ void load(const float* __restrict__ src, size_t stride, int valid,
                                         int head_dim) {
#pragma unroll
        for (int u = 0; u < N; ++u) {
            const int idx = threadIdx.x + u * ATT_THREADS;
            const int n = idx / D;
            const int t = idx % D;
            r[u] = (n < valid && t < head_dim) ? src[(size_t)n * stride + t] : 0.0f;
        }
    }

    __device__ __forceinline__ void store(float* dst) const {
#pragma unroll
        for (int u = 0; u < N; ++u) {
            const int idx = threadIdx.x + u * ATT_THREADS;
            dst[(idx / D) * (D + 1) + idx % D] = r[u];
        }
    }
};

// Stores a staged tile to shared memory between two barriers: the first lets
// every thread finish reading what the buffer held, the second makes the
// tile visible to all.
template <int D, int ROWS>
__device__ __forceinline__ void att_publish(const AttTile<D, ROWS>& tile, float* dst) {
    __syncthreads();
    tile.store(dst);
    __syncthreads();
}

// out[rr][n] = <a_rr, kv_n> for the thread's two rows a_rr = a + (2g + rr) * LD
// and its keys kv_n = kv + (c + 16 n) * LD of a chunk (both padded to D).
template <int D>
__device__ __forceinline__ void att_dots(const float* a, const float* kv, int g, int c,
                                         float (&out)[2][AttShape<D>::KEYS]) {
    using S = AttShape<D>;
#pragma unroll
    for (int rr = 0; rr < 2; ++rr)
#pragma unroll
        for (int n = 0; n < S::KEYS; ++n) out[rr][n] = 0.0f;
#pragma unroll 8
    for (int t = 0; t < D; ++t) {
        const float a0 = a[(2 * g) * S::LD + t];
        const float a1 = a[(2 * g + 1) * S::LD + t];
#pragma unroll
        for (int n = 0; n < S::KEYS; ++n) {
            const float kk = kv[(c + n * ATT_LANES) * S::LD + t];
            out[0][n] = fmaf(a0, kk, out[0][n]);
            out[1][n] = fmaf(a1, kk, out[1][n]);
        }
    }
}

// acc[rr][n] += sum_jj w[(2g + rr)][jj] * rows[jj][c + 16 n] over a chunk: the
// thread's two rows of weights (ld CHUNK + 1) times the chunk's rows (ld LD).
template <int D>
__device__ __forceinline__ void att_accumulate(const float* w, const float* rows, int g, int c,
                                               float (&acc)[2][AttShape<D>::COLS]) {
    using S = AttShape<D>;
#pragma unroll 4
    for (int jj = 0; jj < S::CHUNK; ++jj) {
        const float w0 = w[(2 * g) * (S::CHUNK + 1) + jj];
        const float w1 = w[(2 * g + 1) * (S::CHUNK + 1) + jj];
#pragma unroll
        for (int n = 0; n < S::COLS; ++n) {
            const float r = rows[jj * S::LD + c + n * ATT_LANES];
            acc[0][n] = fmaf(w0, r, acc[0][n]);
            acc[1][n] = fmaf(w1, r, acc[1][n]);
        }
    }
}

// Forward: out[b, i, h, :] and probs[b, h, i, :] for 32 query rows i. Grid
// (ceil(seq / 32), heads, batch), 256 threads, dynamic shared memory
// (ATT_ROWS + CHUNK) * (D + 1) + ATT_ROWS * (CHUNK + 1) floats.
template <int D>
__device__ __forceinline__ void attention_fwd(const float* __restrict__ q,
                                              const float* __restrict__ k,
                                              const float* __restrict__ v,
                                              float* __restrict__ out,
                                              float* __restrict__ probs, int batch, int seq,
                                              int heads, int kv_heads, int head_dim, float scale,
                                              long long write_limit) {
    using S = AttShape<D>;
    extern __shared__ float att_smem[];
    float* qs = att_smem;                   // [ATT_ROWS][LD]
    float* kvs = qs + ATT_ROWS * S::LD;     // [CHUNK][LD]: k, then v, of a chunk
    float* ps = kvs + S::CHUNK * S::LD;     // [ATT_ROWS][CHUNK + 1]

    const int r0 = blockIdx.x * ATT_ROWS;
    const int h = blockIdx.y;
    const int b = blockIdx.z;
    if (r0 >= seq || h >= heads || b >= batch) return;  // whole block
    const int kvh = h / (heads / kv_heads);
    const int g = threadIdx.x / ATT_LANES;
    const int c = threadIdx.x % ATT_LANES;
    // Keys 0 ..= last row of the tile. Every chunk starts at or before r0, so
    // key j0 of a chunk is visible to every row and each chunk maximum is
    // finite (rows past seq see every key j < seq; they are never stored).
    const int key_end = min(seq, r0 + ATT_ROWS);
    const size_t kv_stride = (size_t)kv_heads * head_dim;
    const size_t q_stride = (size_t)heads * head_dim;

    {
        AttTile<D, ATT_ROWS> tq;
        tq.load(q + att_q_at(b, r0, h, seq, heads, head_dim), q_stride, seq - r0, head_dim);
        tq.store(qs);
    }
    int row[2];
    bool ok[2];
    size_t p_row[2];
    float m[2], l[2], acc[2][S::COLS];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        row[rr] = r0 + 2 * g + rr;
        ok[rr] = row[rr] < seq;
        p_row[rr] = att_p_at(b, h, ok[rr] ? row[rr] : 0, seq, heads);
        m[rr] = ATT_NEG_INF;
        l[rr] = 0.0f;
#pragma unroll
        for (int n = 0; n < S::COLS; ++n) acc[rr][n] = 0.0f;
    }

    AttTile<D, S::CHUNK> tk, tv;
    tk.load(k + att_kv_at(b, 0, kvh, seq, kv_heads, head_dim), kv_stride, seq, head_dim);
    for (int j0 = 0; j0 < key_end; j0 += S::CHUNK) {
        const int valid = seq - j0;
        tv.load(v + att_kv_at(b, j0, kvh, seq, kv_heads, head_dim), kv_stride, valid, head_dim);
        att_publish(tk, kvs);  // after qs is stored and the previous chunk's v read
        float s[2][S::KEYS];
        att_dots<D>(qs, kvs, g, c, s);
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            float chunk_max = ATT_NEG_INF;
#pragma unroll
            for (int n = 0; n < S::KEYS; ++n) {
                const int j = j0 + c + n * ATT_LANES;
                float sv = ATT_NEG_INF;
                if (j < seq && (j <= row[rr] || !ok[rr])) {
                    sv = scale * s[rr][n];
                    if (ok[rr]) probs[p_row[rr] + j] = sv;  // raw score; normalised below
                }
                s[rr][n] = sv;
                chunk_max = fmaxf(chunk_max, sv);
            }
            const float m_new = fmaxf(m[rr], att_row_max(chunk_max));
            const float alpha = expf(m[rr] - m_new);
            float part = 0.0f;
#pragma unroll
            for (int n = 0; n < S::KEYS; ++n) {
                const float e = expf(s[rr][n] - m_new);
                part += e;
                ps[(2 * g + rr) * (S::CHUNK + 1) + c + n * ATT_LANES] = e;
            }
            l[rr] = l[rr] * alpha + att_row_sum(part);
            m[rr] = m_new;
#pragma unroll
            for (int n = 0; n < S::COLS; ++n) acc[rr][n] *= alpha;
        }
        if (j0 + S::CHUNK < key_end) {
            tk.load(k + att_kv_at(b, j0 + S::CHUNK, kvh, seq, kv_heads, head_dim), kv_stride,
                    valid - S::CHUNK, head_dim);
        }
        att_publish(tv, kvs);  // after k is read and ps is complete
        // Keys past seq have weight exp(-inf) = 0 and zero rows of v.
        att_accumulate<D>(ps, kvs, g, c, acc);
    }

    const int zero_from = ((key_end + S::CHUNK - 1) / S::CHUNK) * S::CHUNK;
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        if (!ok[rr]) continue;
        const float inv_l = 1.0f / l[rr];
        const size_t o_row = att_q_at(b, row[rr], h, seq, heads, head_dim);
#pragma unroll
        for (int n = 0; n < S::COLS; ++n) {
            const int t = c + n * ATT_LANES;
            const size_t idx = o_row + t;
            if (t < head_dim && (long long)idx < write_limit) out[idx] = acc[rr][n] * inv_l;
        }
        // This thread's own entries: raw scores (j <= i) to probabilities.
        for (int j = c; j < zero_from && j < seq; j += ATT_LANES) {
            float p = 0.0f;
            if (j <= row[rr]) p = expf(probs[p_row[rr] + j] - m[rr]) * inv_l;
            probs[p_row[rr] + j] = p;
        }
        for (int j = zero_from + c; j < seq; j += ATT_LANES) probs[p_row[rr] + j] = 0.0f;
    }
}

// Backward, part 1: dS (into ds, entries j <= i) and dq for 32 query rows.
// Grid (ceil(seq / 32), heads, batch), 256 threads, the forward's dynamic
// shared memory. D_i = <dout_i, out_i> needs no pass over the keys, so each
// chunk is visited once: dP from v, then dS, then dS k.
template <int D>
__device__ __forceinline__ void attention_bwd_dq(const float* __restrict__ k,
                                                 const float* __restrict__ v,
                                                 const float* __restrict__ probs,
                                                 const float* __restrict__ out,
                                                 const float* __restrict__ dout,
                                                 float* __restrict__ dq, float* __restrict__ ds,
                                                 int batch, int seq, int heads, int kv_heads,
                                                 int head_dim, float scale) {
    using S = AttShape<D>;
    extern __shared__ float att_smem[];
    float* dos = att_smem;                  // [ATT_ROWS][LD]: dout rows
    float* kvs = dos + ATT_ROWS * S::LD;    // [CHUNK][LD]: v, then k, of a chunk
    float* ss = kvs + S::CHUNK * S::LD;     // [ATT_ROWS][CHUNK + 1]: dS

    const int r0 = blockIdx.x * ATT_ROWS;
    const int h = blockIdx.y;
    const int b = blockIdx.z;
    if (r0 >= seq || h >= heads || b >= batch) return;
    const int kvh = h / (heads / kv_heads);
    const int g = threadIdx.x / ATT_LANES;
    const int c = threadIdx.x % ATT_LANES;
    const int key_end = min(seq, r0 + ATT_ROWS);
    const size_t kv_stride = (size_t)kv_heads * head_dim;
    const size_t q_stride = (size_t)heads * head_dim;

    {
        AttTile<D, ATT_ROWS> td;
        td.load(dout + att_q_at(b, r0, h, seq, heads, head_dim), q_stride, seq - r0, head_dim);
        td.store(dos);
    }
    int row[2];
    bool ok[2];
    size_t p_row[2];
    float d_row[2], acc[2][S::COLS];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        row[rr] = r0 + 2 * g + rr;
        ok[rr] = row[rr] < seq;
        p_row[rr] = att_p_at(b, h, ok[rr] ? row[rr] : 0, seq, heads);
        float part = 0.0f;
        if (ok[rr]) {
            const size_t o_row = att_q_at(b, row[rr], h, seq, heads, head_dim);
#pragma unroll
            for (int n = 0; n < S::COLS; ++n) {
                const int t = c + n * ATT_LANES;
                if (t < head_dim) part = fmaf(dout[o_row + t], out[o_row + t], part);
            }
        }
        d_row[rr] = att_row_sum(part);
#pragma unroll
        for (int n = 0; n < S::COLS; ++n) acc[rr][n] = 0.0f;
    }

    AttTile<D, S::CHUNK> tv, tk;
    tv.load(v + att_kv_at(b, 0, kvh, seq, kv_heads, head_dim), kv_stride, seq, head_dim);
    for (int j0 = 0; j0 < key_end; j0 += S::CHUNK) {
        const int valid = seq - j0;
        tk.load(k + att_kv_at(b, j0, kvh, seq, kv_heads, head_dim), kv_stride, valid, head_dim);
        // This thread's probabilities of the chunk, loaded now so that their
        // latency overlaps the dP products below.
        float pr[2][S::KEYS];
#pragma unroll
        for (int rr = 0; rr < 2; ++rr)
#pragma unroll
            for (int n = 0; n < S::KEYS; ++n) {
                const int j = j0 + c + n * ATT_LANES;
                pr[rr][n] = (ok[rr] && j <= row[rr]) ? probs[p_row[rr] + j] : 0.0f;
            }
        att_publish(tv, kvs);  // after dos is stored and the previous chunk's k read
        float dp[2][S::KEYS];
        att_dots<D>(dos, kvs, g, c, dp);
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
#pragma unroll
            for (int n = 0; n < S::KEYS; ++n) {
                const int j = j0 + c + n * ATT_LANES;
                float gs = 0.0f;
                if (ok[rr] && j <= row[rr]) {
                    gs = pr[rr][n] * (dp[rr][n] - d_row[rr]);
                    ds[p_row[rr] + j] = gs;
                }
                ss[(2 * g + rr) * (S::CHUNK + 1) + c + n * ATT_LANES] = gs;
            }
        }
        if (j0 + S::CHUNK < key_end) {
            tv.load(v + att_kv_at(b, j0 + S::CHUNK, kvh, seq, kv_heads, head_dim), kv_stride,
                    valid - S::CHUNK, head_dim);
        }
        att_publish(tk, kvs);  // after v is read and ss is complete
        att_accumulate<D>(ss, kvs, g, c, acc);
    }
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        if (!ok[rr]) continue;
        const size_t o_row = att_q_at(b, row[rr], h, seq, heads, head_dim);
#pragma unroll
        for (int n = 0; n < S::COLS; ++n) {
            const int t = c + n * ATT_LANES;
            if (t < head_dim) dq[o_row + t] = scale * acc[rr][n];
        }
    }
}

// Backward, part 2: one query head's share of dk and dv for 32 key rows j,
// summed over the query rows i >= j, in chunks of QCHUNK query rows (q and
// dout rows, and the matching dS and P entries, masked to i >= j):
//   pk[b, j, h, :] = sum_{i >= j} dS_ij q_i,   pv[b, j, h, :] = sum_{i >= j} P_ij dout_i.
// One block per (key tile, query head, batch) rather than per kv head keeps
// every SM busy; part 3 sums the group's heads in a fixed order. Grid
// (ceil(seq / 32), heads, batch), 256 threads, dynamic shared memory
// 2 * QCHUNK * (D + 1) + 2 * ATT_ROWS * (QCHUNK + 1) floats.
template <int D>
__device__ __forceinline__ void attention_bwd_dkv(const float* __restrict__ q,
                                                  const float* __restrict__ dout,
                                                  const float* __restrict__ probs,
                                                  const float* __restrict__ ds,
                                                  float* __restrict__ pk, float* __restrict__ pv,
                                                  int batch, int seq, int heads, int head_dim) {
    using S = AttShape<D>;
    constexpr int QC = S::QCHUNK;
    constexpr int LT = QC + 1;
    // dS and P entries of a chunk per thread: (QC query rows x ATT_ROWS keys) / 256.
    constexpr int E = QC * ATT_ROWS / ATT_THREADS;
    extern __shared__ float att_smem[];
    float* qs = att_smem;                   // [QC][LD]: q rows
    float* dos = qs + QC * S::LD;           // [QC][LD]: dout rows
    float* sts = dos + QC * S::LD;          // [ATT_ROWS][LT]: dS^T
    float* pts = sts + ATT_ROWS * LT;       // [ATT_ROWS][LT]: P^T

    const int j0 = blockIdx.x * ATT_ROWS;
    const int h = blockIdx.y;
    const int b = blockIdx.z;
    if (j0 >= seq || h >= heads || b >= batch) return;
    const int g = threadIdx.x / ATT_LANES;
    const int c = threadIdx.x % ATT_LANES;
    const size_t q_stride = (size_t)heads * head_dim;

    float ka[2][S::COLS], va[2][S::COLS];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr)
#pragma unroll
        for (int n = 0; n < S::COLS; ++n) {
            ka[rr][n] = 0.0f;
            va[rr][n] = 0.0f;
        }
    for (int i0 = j0; i0 < seq; i0 += QC) {
        const int rows = seq - i0;
        AttTile<D, QC> tq, td;
        tq.load(q + att_q_at(b, i0, h, seq, heads, head_dim), q_stride, rows, head_dim);
        td.load(dout + att_q_at(b, i0, h, seq, heads, head_dim), q_stride, rows, head_dim);
        // Entry e: query row ii = e / 32, key rr = e % 32, so a warp reads 32
        // consecutive floats of one row of ds and of probs.
        float se[E], pe[E];
#pragma unroll
        for (int u = 0; u < E; ++u) {
            const int e = threadIdx.x + u * ATT_THREADS;
            const int ir = i0 + e / ATT_ROWS;
            const int jr = j0 + e % ATT_ROWS;
            se[u] = 0.0f;
            pe[u] = 0.0f;
            if (ir < seq && jr < seq && ir >= jr) {
                const size_t at = att_p_at(b, h, ir, seq, heads) + jr;
                se[u] = ds[at];
                pe[u] = probs[at];
            }
        }
        __syncthreads();  // the previous chunk is no longer read
        tq.store(qs);
        td.store(dos);
#pragma unroll
        for (int u = 0; u < E; ++u) {
            const int e = threadIdx.x + u * ATT_THREADS;
            sts[(e % ATT_ROWS) * LT + e / ATT_ROWS] = se[u];
            pts[(e % ATT_ROWS) * LT + e / ATT_ROWS] = pe[u];
        }
        __syncthreads();
#pragma unroll 4
        for (int ii = 0; ii < QC; ++ii) {
            const float s0 = sts[(2 * g) * LT + ii];
            const float s1 = sts[(2 * g + 1) * LT + ii];
            const float p0 = pts[(2 * g) * LT + ii];
            const float p1 = pts[(2 * g + 1) * LT + ii];
#pragma unroll
            for (int n = 0; n < S::COLS; ++n) {
                const float qv = qs[ii * S::LD + c + n * ATT_LANES];
                const float dv = dos[ii * S::LD + c + n * ATT_LANES];
                ka[0][n] = fmaf(s0, qv, ka[0][n]);
                ka[1][n] = fmaf(s1, qv, ka[1][n]);
                va[0][n] = fmaf(p0, dv, va[0][n]);
                va[1][n] = fmaf(p1, dv, va[1][n]);
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        const int j = j0 + 2 * g + rr;
        if (j >= seq) continue;
        const size_t o_row = att_q_at(b, j, h, seq, heads, head_dim);
#pragma unroll
        for (int n = 0; n < S::COLS; ++n) {
            const int t = c + n * ATT_LANES;
            if (t < head_dim) {
                pk[o_row + t] = ka[rr][n];
                pv[o_row + t] = va[rr][n];
            }
        }
    }
}

// The kernel entry points. One kernel per macro, so each module (below)
// holds one of them. P names the set (`attention` for the f32 kernels,
// `attention_tc` for the tensor-core ones), IMPL its device function and
// BOUNDS(D) its launch bounds; both sets take the same arguments.
#define ATT_FWD_ENTRY(P, IMPL, BOUNDS, D)                                                     \
    extern "C" __global__ void BOUNDS(D) P##_fwd_d##D##_f32(                                  \
        const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v, \
        float* __restrict__ out, float* __restrict__ probs, int batch, int seq, int heads,    \
        int kv_heads, int head_dim, float scale, long long write_limit) {                     \
        IMPL<D>(q, k, v, out, probs, batch, seq, heads, kv_heads, head_dim, scale,           \
                write_limit);                                                                 \
    }
#define ATT_DQ_ENTRY(P, IMPL, BOUNDS, D)                                                      \
    extern "C" __global__ void BOUNDS(D) P##_bwd_dq_d##D##_f32(                               \
        const float* __restrict__ k, const float* __restrict__ v,                             \
        const float* __restrict__ probs, const float* __restrict__ out,                       \
        const float* __restrict__ dout, float* __restrict__ dq, float* __restrict__ ds,       \
        int batch, int seq, int heads, int kv_heads, int head_dim, float scale) {             \
        IMPL<D>(k, v, probs, out, dout, dq, ds, batch, seq, heads, kv_heads, head_dim,       \
                scale);                                                                       \
    }
#define ATT_DKV_ENTRY(P, IMPL, BOUNDS, D)                                                     \
    extern "C" __global__ void BOUNDS(D) P##_bwd_dkv_d##D##_f32(                              \
        const float* __restrict__ q, const float* __restrict__ dout,                          \
        const float* __restrict__ probs, const float* __restrict__ ds, float* __restrict__ pk, \
        float* __restrict__ pv, int batch, int seq, int heads, int head_dim) {                \
        IMPL<D>(q, dout, probs, ds, pk, pv, batch, seq, heads, head_dim);                     \
    }

#define ATT_F32_BOUNDS(D) __launch_bounds__(ATT_THREADS)
#define ATT_FWD(D) ATT_FWD_ENTRY(attention, attention_fwd, ATT_F32_BOUNDS, D)
#define ATT_DQ(D) ATT_DQ_ENTRY(attention, attention_bwd_dq, ATT_F32_BOUNDS, D)
#define ATT_DKV(D) ATT_DKV_ENTRY(attention, attention_bwd_dkv, ATT_F32_BOUNDS, D)

// ---------------------------------------------------------------------------
// Tensor-core kernels: the same arguments, layouts and outputs as the f32
// kernels above, with every product on the tensor cores (TF32 inputs rounded
// to nearest, f32 accumulation; see tc_tf32) through
// mma.sync.m16n8k8.row.col.f32.tf32.tf32.f32. Softmax, masking and the dS
// formula stay in f32 on the CUDA cores.
//
// Tiling. A block owns a tile of TC_ROWS = 64 rows (query rows for the
// forward and dq, key rows for dk/dv) in four row groups of 16, the M of the
// mma, one warp each. The grid is small (qwen2.5-0.5b: 224 blocks), so a
// warp has few peers to hide its latencies behind. TcShape::SPLIT > 1 gives
// each row group SPLIT warps that split the inner dimension of every chunk
// (keys for the forward and dq, query rows for dk/dv) and add their partial
// accumulators at the end in warp order through shared memory (warp w: row
// group w % 4, part w / 4). It is 1 in both builds: measured on an H100 at
// qwen2.5-0.5b's shape, SPLIT = 2 in the d64 build was slower (fwd + dq +
// dk/dv 101.8 us against 92.5 us), the 128-register cap that two 256-thread
// blocks per SM need making the forward and dq spill.
//
// Operands that every warp shares (k and v chunks; q and dout chunks for
// dk/dv) are copied to shared memory with cp.async, two buffers, so the next
// chunk is in flight while the current one is multiplied; each thread rounds
// the elements it copied to tf32 in place, once per block rather than once
// per warp that reads them. With g = lane / 4 and t = lane % 4 (the PTX
// fragment layouts), a B operand is read from shared memory at one of two
// patterns, each free of bank conflicts with its row padding:
//   "k-style" (the tile's rows are the mma's n): row n0 + g, columns
//     k0 + 2t and 2t + 1 as one 8-byte load; rows of D + 8 floats (8 banks
//     apart, so the 4 rows of a half warp cover the 32 banks once);
//   "v-style" (the tile's rows are the mma's k): rows k0 + 2t and 2t + 1,
//     column n0 + g; rows of D + 4 floats (banks 8t + g).
//
// The k order of an mma is free (a product sums over k), so a k-step's
// index t may stand for column 2t and t + 4 for 2t + 1, in A and B alike:
//   - for S = q k^T and dP = dout v^T this makes B's two registers adjacent
//     in a k-style row (one 8-byte load), and A's too;
//   - an accumulator (thread (g, t) holds columns 2t and 2t + 1 of rows g and
//     g + 8) then is an A operand as it is: P V and dS k use the softmax and
//     dS results straight from registers, with B read v-style; dS^T q and
//     P^T dout read their A operands from global memory in the same order.
//
// Every mma loop runs over whole chunks with no per-tile branch, so the
// compiler interleaves the independent accumulators (a warp has few peers
// on its scheduler to hide the mma latency: the grid is small). Tiles wholly
// above the diagonal cost some products but are masked like the rest.
//
// Forward: two passes over the keys, both cheap on the tensor cores. The first
// computes each row's max m and sum l (online, per thread, then combined over
// the 4 threads of a row); the second recomputes S, writes P = exp(S - m) / l
// to probs once, and accumulates P V. So probs is written once, with no
// read-back, and out needs no rescaling. The query rows are multiplied by
// scale log2(e) as they are staged, so the scores come out in log2 units,
// s' = scale log2(e) <q_i, k_j>, and P = 2^(s' - m') / l' with MUFU.EX2
// alone: no multiply per score for the scale or for exp's base change.
//
// Where the time goes (ncu at qwen2.5-0.5b's shape; figures in the book's
// performance pages): not memory (DRAM far below its peak) and not the
// tensor cores, but the latency of each warp's instruction stream: about
// 2 warps per scheduler, several cycles per issued instruction
// (short-scoreboard and fixed-latency waits; long-scoreboard in dq), and
// integer address and mask arithmetic outnumbering the mma instructions
// several times over.
// Fewer instructions per chunk (unmasked chunks below the diagonal) and more
// independent warps without spilling are the levers left.

#define TC_ROW_GROUPS 4
#define TC_ROWS (TC_ROW_GROUPS * 16)

__host__ __device__ constexpr int tc_max(int a, int b) { return a > b ? a : b; }

template <int D>
struct TcShape {
    static constexpr int SPLIT = 1;  // warps per row group (see Tiling)
    static constexpr int THREADS = 32 * TC_ROW_GROUPS * SPLIT;
    // Blocks per SM asked of __launch_bounds__: with SPLIT = 2 the grid fits
    // the device at once only with two blocks per SM.
    static constexpr int MIN_BLOCKS = SPLIT > 1 ? 2 : 1;
    static constexpr int LDK = D + 8;                 // row of a tile read k-style
    static constexpr int LDV = D + 4;                 // row of a tile read v-style
    // Keys per chunk (fwd, dq): 32 x 64 or 16 x 128, so a chunk's scores
    // are 32 mma per warp in either build. Twice that (one more unrolled
    // copy of every mma loop) made the forward module the slowest compile of
    // the cold pre-warm. In a lab on an H100 the three kernels of a layer
    // take 81 us with these chunks, 78 us with chunks twice as long.
    static constexpr int CHUNK = D <= 64 ? 32 : 16;
    static constexpr int NT = CHUNK / 8;              // 8-key tiles of a chunk
    static constexpr int NH = NT / SPLIT;             // ... of one warp's part
    static constexpr int QCHUNK = D <= 64 ? 32 : 16;  // query rows per chunk (dk/dv)
    static constexpr int QT = QCHUNK / 8;             // 8-query steps of a chunk
    static constexpr int QH = QT / SPLIT;             // ... of one warp's part
    static constexpr int KT = D / 8;                  // 8-wide steps of head_dim
    // Shared memory of every kernel, the largest of what they stage: the
    // TC_ROWS query or dout rows (fwd, dq, first), two buffers of CHUNK rows
    // of LDK floats (fwd, dq), and two stages of a q and a dout chunk of LDV
    // rows (dk/dv): 34,816 bytes in both builds, under the 48 KiB a launch
    // gets without opting in.
    static constexpr int BUF = CHUNK * LDK;
    static constexpr int ROW_TILE = TC_ROWS * LDK;
    static constexpr int KV_STAGES = 4 * QCHUNK * LDV;
    static constexpr int SMEM_FLOATS = tc_max(tc_max(ROW_TILE, 2 * BUF), KV_STAGES);
};
// The launcher passes 34,816 bytes (ops/attention.rs, TC_SMEM).
static_assert(TcShape<64>::SMEM_FLOATS * 4 == 34816, "the launcher's shared memory, d64");
static_assert(TcShape<128>::SMEM_FLOATS * 4 == 34816, "the launcher's shared memory, d128");
// tc_sum_split passes 32 floats per thread through the buffers.
static_assert(32 * TcShape<64>::THREADS <= TcShape<64>::SMEM_FLOATS, "split sums fit");
static_assert(32 * TcShape<128>::THREADS <= TcShape<128>::SMEM_FLOATS, "split sums fit");

// 2^x (MUFU.EX2; 2^-inf = 0).
__device__ __forceinline__ float tc_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Asynchronous copies global -> shared of 16 or 4 bytes; `bytes` 0 writes
// zeros and reads nothing.
__device__ __forceinline__ void tc_cp16(float* dst, const float* src, int bytes) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void tc_cp4(float* dst, const float* src, int bytes) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(s), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void tc_commit() { asm volatile("cp.async.commit_group;"); }
// Waits until at most one committed group (the latest) is still in flight.
__device__ __forceinline__ void tc_wait_prev() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
__device__ __forceinline__ void tc_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

// A ROWS x D tile in shared memory, rows of LD floats. Thread threadIdx.x
// owns the same elements in stage() and round(), so after its copies land
// it can round them without a barrier in between.
template <int D, int ROWS, int LD>
struct TcTile {
    static constexpr int T = TcShape<D>::THREADS;
    float* s;

    // In the 16-byte layout thread x copies (and rounds) column c = 4 (x %
    // (D / 4)) of rows x / (D / 4) + u STEP: the same column every time, so
    // its addresses advance by a constant.
    static constexpr int STEP = T / (D / 4);
    static_assert(T % (D / 4) == 0, "a thread keeps its column");

    // Starts copying rows n < valid (row n at src + n * stride, head_dim
    // floats); the rest of the tile, rows past valid and columns past
    // head_dim, becomes zeros. `vec`: head_dim % 4 == 0 and src 16-byte
    // aligned, so rows move in 16-byte pieces (stride is a multiple of
    // head_dim).
    __device__ __forceinline__ void stage(const float* __restrict__ src, size_t stride, int valid,
                                          int head_dim, bool vec) const {
        if (vec) {
            const int c = 4 * (threadIdx.x % (D / 4));
            const int n0 = threadIdx.x / (D / 4);
            const bool col_in = c < head_dim;
            const float* from = src + (size_t)n0 * stride + c;
            float* to = s + n0 * LD + c;
#pragma unroll
            for (int u = 0; u * STEP < ROWS; ++u) {
                if (ROWS % STEP != 0 && n0 + u * STEP >= ROWS) break;
                const bool in = col_in && n0 + u * STEP < valid;
                tc_cp16(to + u * STEP * LD, in ? from + (size_t)u * STEP * stride : src,
                        in ? 16 : 0);
            }
        } else {
#pragma unroll 1  // the rare path: a smaller module compiles faster
            for (int e = threadIdx.x; e < ROWS * D; e += T) {
                const int n = e / D;
                const int c = e % D;
                const bool in = n < valid && c < head_dim;
                tc_cp4(s + n * LD + c, in ? src + (size_t)n * stride + c : src, in ? 4 : 0);
            }
        }
    }

    // Rounds this thread's elements, times mul, to tf32, after its copies
    // landed (mul = 1 is folded away).
    __device__ __forceinline__ void round(bool vec, float mul = 1.0f) const {
        if (vec) {
            const int n0 = threadIdx.x / (D / 4);
            float* at = s + n0 * LD + 4 * (threadIdx.x % (D / 4));
#pragma unroll
            for (int u = 0; u * STEP < ROWS; ++u) {
                if (ROWS % STEP != 0 && n0 + u * STEP >= ROWS) break;
                float4* p = reinterpret_cast<float4*>(at + u * STEP * LD);
                const float4 x = *p;
                *p = make_float4(tc_tf32(mul * x.x), tc_tf32(mul * x.y), tc_tf32(mul * x.z),
                                 tc_tf32(mul * x.w));
            }
        } else {
#pragma unroll 1  // the rare path: a smaller module compiles faster
            for (int e = threadIdx.x; e < ROWS * D; e += T) {
                float* p = s + (e / D) * LD + e % D;
                *p = tc_tf32(mul * *p);
            }
        }
    }
};

// The A operands of the 16 rows at `rows` (a k-style tile, already tf32), all
// KT steps of head_dim, in the k order above: a[kt] = rows g and g + 8 at
// columns 8 kt + 2t (registers 0, 1) and 8 kt + 2t + 1 (registers 2, 3).
template <int D>
__device__ __forceinline__ void tc_load_a(const float* rows, int g, int t,
                                          float (&a)[TcShape<D>::KT][4]) {
    constexpr int LD = TcShape<D>::LDK;
#pragma unroll
    for (int kt = 0; kt < TcShape<D>::KT; ++kt) {
        const float2 lo = *reinterpret_cast<const float2*>(rows + g * LD + 8 * kt + 2 * t);
        const float2 hi = *reinterpret_cast<const float2*>(rows + (g + 8) * LD + 8 * kt + 2 * t);
        a[kt][0] = lo.x;
        a[kt][1] = hi.x;
        a[kt][2] = lo.y;
        a[kt][3] = hi.y;
    }
}

// s[n] = a kv_n^T for N 8-key tiles n from kv (k-style, tf32): the warp's
// 16 rows times its 8N keys.
template <int D, int N>
__device__ __forceinline__ void tc_scores(const float (&a)[TcShape<D>::KT][4], const float* kv,
                                          int g, int t, float (&s)[N][4]) {
    using S = TcShape<D>;
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = 0.0f;
    const float* row = kv + g * S::LDK + 2 * t;
#pragma unroll
    for (int kt = 0; kt < S::KT; ++kt)
#pragma unroll
        for (int n = 0; n < N; ++n) {
            const float2 b = *reinterpret_cast<const float2*>(row + 8 * n * S::LDK + 8 * kt);
            tc_mma(s[n], a[kt], b.x, b.y);
        }
}

// acc += w rows: w is the warp's 16 x 8N accumulator (f32, rounded here;
// read as A operands in the k order above) and rows its 8N rows, v-style,
// tf32.
template <int D, int N>
__device__ __forceinline__ void tc_accumulate(const float (&w)[N][4], const float* rows, int g,
                                              int t, float (&acc)[TcShape<D>::KT][4]) {
    using S = TcShape<D>;
#pragma unroll
    for (int n = 0; n < N; ++n) {
        const float a[4] = {tc_tf32(w[n][0]), tc_tf32(w[n][2]), tc_tf32(w[n][1]), tc_tf32(w[n][3])};
        const float* r = rows + (8 * n + 2 * t) * S::LDV + g;
#pragma unroll
        for (int nd = 0; nd < S::KT; ++nd) tc_mma(acc[nd], a, r[8 * nd], r[S::LDV + 8 * nd]);
    }
}

// Stores the pair (x, y) at p[0], p[1]; p[1] only when `second`. `pair`:
// both exist and p is 8-byte aligned.
__device__ __forceinline__ void tc_store2(float* p, float x, float y, bool pair, bool second) {
    if (pair) {
        *reinterpret_cast<float2*>(p) = make_float2(x, y);
    } else {
        p[0] = x;
        if (second) p[1] = y;
    }
}

// Where a thread sits in a tile of the tc kernels: row group rg, split
// part kh, and (g, t) of the fragment layouts.
struct TcLane {
    int rg, kh, g, t;
    __device__ __forceinline__ TcLane()
        : rg((threadIdx.x / 32) % TC_ROW_GROUPS),
          kh(threadIdx.x / (32 * TC_ROW_GROUPS)),
          g((threadIdx.x % 32) / 4),
          t(threadIdx.x % 4) {}
};

// Combines a running (max, sum) pair (m, l) with another, (mo, lo), both sums
// of powers of 2 (TcSoftmaxStats). A side that saw no key has m = -inf and
// l = 0; its factor is 1, not 2^(-inf + inf) = NaN, when the other saw none
// either.
__device__ __forceinline__ void tc_merge(float& m, float& l, float mo, float lo) {
    const float mn = fmaxf(m, mo);
    l = l * (m == mn ? 1.0f : tc_exp2(m - mn)) + lo * (mo == mn ? 1.0f : tc_exp2(mo - mn));
    m = mn;
}

// acc of part 0 += acc of the other parts of the row group, in part order,
// through shared memory x (free: call it after the last read of the buffers;
// every thread of the block calls it). 32 floats per thread per round, laid
// out [float][thread] so each store and load is one conflict-free row.
template <int D, int R>
__device__ __forceinline__ void tc_sum_split(float (&acc)[R][4], float* x, int kh) {
    constexpr int T = TcShape<D>::THREADS;
    constexpr int PART = T / TcShape<D>::SPLIT;  // threads of one part
    constexpr int N = TcShape<D>::SPLIT > 1 ? 4 * R : 0;  // nothing to add with one part
#pragma unroll
    for (int base = 0; base < N; base += 32) {
        __syncthreads();  // x is no longer read (buffers or the previous round)
        if (kh != 0) {
#pragma unroll
            for (int i = 0; i < 32 && base + i < 4 * R; ++i)
                x[i * T + threadIdx.x] = acc[(base + i) / 4][(base + i) % 4];
        }
        __syncthreads();
        if (kh == 0) {
#pragma unroll
            for (int i = 0; i < 32 && base + i < 4 * R; ++i)
#pragma unroll
                for (int p = 1; p < TcShape<D>::SPLIT; ++p)
                    acc[(base + i) / 4][(base + i) % 4] += x[i * T + threadIdx.x + p * PART];
        }
    }
}

// The running max m and sum l = sum 2^(x - m) of a row over the values x a
// thread sees (scores in log2 units, see the forward); merge() combines the
// 4 threads of a row (xor shuffles, the same order every run).
struct TcSoftmaxStats {
    float m = ATT_NEG_INF;
    float l = 0.0f;

    template <int N>
    __device__ __forceinline__ void add(float chunk_max, const float (&vals)[N]) {
        const float m_new = fmaxf(m, chunk_max);
        if (m_new == ATT_NEG_INF) return;  // nothing visible yet
        float part = 0.0f;
#pragma unroll
        for (int e = 0; e < N; ++e) part += tc_exp2(vals[e] - m_new);
        l = l * tc_exp2(m - m_new) + part;
        m = m_new;
    }

    __device__ __forceinline__ void merge() {
#pragma unroll
        for (int o = 1; o <= 2; o <<= 1) {
            const float mo = __shfl_xor_sync(0xffffffffu, m, o);
            const float lo = __shfl_xor_sync(0xffffffffu, l, o);
            tc_merge(m, l, mo, lo);
        }
    }
};

// Pass 0 of the forward: adds a chunk's scores to each row's running max
// and sum. j: the key of s[n][e] is j + 8 n + e; keys past lim[r] are
// masked.
template <int D>
__device__ __forceinline__ void tc_softmax_stats(const float (&s)[TcShape<D>::NH][4],
                                                 TcSoftmaxStats (&st)[2], int j,
                                                 const int (&lim)[2]) {
    constexpr int NH = TcShape<D>::NH;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float vals[2 * NH];
        float mx = ATT_NEG_INF;
#pragma unroll
        for (int n = 0; n < NH; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float x = j + 8 * n + e <= lim[r] ? s[n][2 * r + e] : ATT_NEG_INF;
                vals[2 * n + e] = x;
                mx = fmaxf(mx, x);
            }
        st[r].add(mx, vals);
    }
}

// Pass 1 of the forward: turns a chunk's scores (log2 units) into
// P = 2^(s - m) / l in place (masked keys: 0) and stores the visible ones into
// the probs plane `plane` of (b, h).
template <int D>
__device__ __forceinline__ void tc_probs(float (&s)[TcShape<D>::NH][4],
                                         const TcSoftmaxStats (&st)[2], const float (&inv_l)[2],
                                         int j, const int (&lim)[2], const int (&row)[2],
                                         int seq, bool pairs, float* plane) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float m = st[r].m;
        float* pr = plane + (size_t)min(row[r], seq - 1) * seq;
#pragma unroll
        for (int n = 0; n < TcShape<D>::NH; ++n) {
            const int jn = j + 8 * n;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float x = s[n][2 * r + e];
                s[n][2 * r + e] = jn + e <= lim[r] ? tc_exp2(x - m) * inv_l[r] : 0.0f;
            }
            if (row[r] < seq && jn < seq)
                tc_store2(pr + jn, s[n][2 * r], s[n][2 * r + 1], pairs, jn + 1 < seq);
        }
    }
}

// Combines the row statistics of a row group's parts, in part order,
// through shared memory x (free: the key buffers are no longer read).
template <int D>
__device__ __forceinline__ void tc_merge_split(TcSoftmaxStats (&st)[2], float* x) {
    x[4 * threadIdx.x] = st[0].m;
    x[4 * threadIdx.x + 1] = st[0].l;
    x[4 * threadIdx.x + 2] = st[1].m;
    x[4 * threadIdx.x + 3] = st[1].l;
    __syncthreads();
    const int first = threadIdx.x % (32 * TC_ROW_GROUPS);  // this lane in part 0
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        st[r].m = x[4 * first + 2 * r];
        st[r].l = x[4 * first + 2 * r + 1];
#pragma unroll
        for (int p = 1; p < TcShape<D>::SPLIT; ++p) {
            const int o = 4 * (first + p * 32 * TC_ROW_GROUPS) + 2 * r;
            tc_merge(st[r].m, st[r].l, x[o], x[o + 1]);
        }
    }
    __syncthreads();
}

// Forward: out and probs for TC_ROWS query rows. Grid (ceil(seq / TC_ROWS),
// heads, batch), THREADS threads, SMEM_FLOATS of dynamic shared memory. A
// warp takes its part (NH tiles) of every key chunk. The tiles nearest the
// end of the sequence see the most keys; they get the lowest block indices
// so they start first.
template <int D>
__device__ __forceinline__ void attention_tc_fwd(const float* __restrict__ q,
                                                 const float* __restrict__ k,
                                                 const float* __restrict__ v,
                                                 float* __restrict__ out,
                                                 float* __restrict__ probs, int batch, int seq,
                                                 int heads, int kv_heads, int head_dim,
                                                 float scale, long long write_limit) {
    using S = TcShape<D>;
    using KTile = TcTile<D, S::CHUNK, S::LDK>;
    using VTile = TcTile<D, S::CHUNK, S::LDV>;
    extern __shared__ __align__(16) float tc_smem[];
    const int r0 = (gridDim.x - 1 - blockIdx.x) * TC_ROWS;
    const int h = blockIdx.y;
    const int b = blockIdx.z;
    if (r0 >= seq || h >= heads || b >= batch) return;
    const int kvh = h / (heads / kv_heads);
    const TcLane ln;
    const int wr = r0 + 16 * ln.rg;
    const int row[2] = {wr + ln.g, wr + ln.g + 8};
    // Keys j <= lim[r] are visible to row r (rows past seq see all keys, so
    // their max stays finite; they are never stored).
    const int lim[2] = {min(row[0], seq - 1), min(row[1], seq - 1)};
    const int key_end = min(seq, r0 + TC_ROWS);  // keys any row of the block sees
    const int chunks = (key_end + S::CHUNK - 1) / S::CHUNK;
    const int koff = 8 * S::NH * ln.kh;          // this warp's first key of a chunk
    const size_t kv_stride = (size_t)kv_heads * head_dim;
    const size_t q_stride = (size_t)heads * head_dim;
    // 16-byte pieces only: the launcher runs this kernel when head_dim % 4
    // == 0 (q, k, v are whole allocations, so every row is 16-byte aligned)
    // and the f32 forward otherwise (ops/attention.rs, fwd_build). Without
    // the scalar path the module compiles faster; it is on the cold
    // pre-warm's critical path.
    const bool vec = true;
    const float* kb = k + att_kv_at(b, 0, kvh, seq, kv_heads, head_dim);
    const float* vb = v + att_kv_at(b, 0, kvh, seq, kv_heads, head_dim);

    // The query rows, staged across both buffers, into A operands.
    float qa[S::KT][4];
    {
        const TcTile<D, TC_ROWS, S::LDK> tq{tc_smem};
        tq.stage(q + att_q_at(b, r0, h, seq, heads, head_dim), q_stride, seq - r0, head_dim, vec);
        tc_commit();
        tc_wait_all();
        // scale / ln 2 folded into q: the scores come out in log2 units.
        tq.round(vec, scale * 1.4426950408889634f);
        __syncthreads();
        tc_load_a<D>(tc_smem + 16 * ln.rg * S::LDK, ln.g, ln.t, qa);
        __syncthreads();
    }

    // Two passes over the keys in one loop body, so the module holds one
    // copy of the score mma (a second copy made it the slowest compilation
    // of the cold pre-warm). Pass 0: each row's max and sum over this warp's
    // keys. Pass 1: P into probs and P v into the accumulator. k is in the
    // first buffer, v (pass 1 only) in the second; each is refilled with the
    // next chunk as soon as its chunk is read. Every chunk commits two copy
    // groups (v's empty in pass 0), so "all but the latest group" is always
    // the tile about to be read.
    TcSoftmaxStats st[2];
    float inv_l[2] = {0.0f, 0.0f};
    float acc[S::KT][4];
#pragma unroll
    for (int nd = 0; nd < S::KT; ++nd)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nd][e] = 0.0f;
    const bool pairs = seq % 2 == 0;  // then j even, and probs + row * seq + j is 8-byte aligned
    const KTile kt{tc_smem};
    const VTile vt{tc_smem + S::BUF};
#pragma unroll 1
    for (int pass = 0; pass < 2; ++pass) {
        // Opaque to the compiler, so it does not split the loop below into
        // one copy per pass.
        asm volatile("" : "+r"(pass));
        kt.stage(kb, kv_stride, seq, head_dim, vec);
        tc_commit();
        if (pass == 1) vt.stage(vb, kv_stride, seq, head_dim, vec);
        tc_commit();
        for (int c = 0; c < chunks; ++c) {
            const int j0 = c * S::CHUNK;
            const int next = j0 + S::CHUNK;
            tc_wait_prev();  // k of chunk c
            kt.round(vec);
            __syncthreads();
            float s[S::NH][4];
            tc_scores<D>(qa, kt.s + koff * S::LDK, ln.g, ln.t, s);
            __syncthreads();
            if (c + 1 < chunks)
                kt.stage(kb + next * kv_stride, kv_stride, seq - next, head_dim, vec);
            tc_commit();
            if (pass == 0) {
                tc_softmax_stats<D>(s, st, j0 + koff + 2 * ln.t, lim);
                tc_commit();
                continue;
            }
            tc_probs<D>(s, st, inv_l, j0 + koff + 2 * ln.t, lim, row, seq, pairs,
                        probs + att_p_at(b, h, 0, seq, heads));
            tc_wait_prev();  // v of chunk c
            vt.round(vec);
            __syncthreads();
            tc_accumulate<D>(s, vt.s + koff * S::LDV, ln.g, ln.t, acc);
            __syncthreads();
            if (c + 1 < chunks)
                vt.stage(vb + next * kv_stride, kv_stride, seq - next, head_dim, vec);
            tc_commit();
        }
        if (pass == 0) {
            // The row's 4 threads combine, then its parts (through shared
            // memory), so every part ends with the same m and l.
#pragma unroll
            for (int r = 0; r < 2; ++r) st[r].merge();
            if (S::SPLIT > 1) tc_merge_split<D>(st, tc_smem);
            inv_l[0] = 1.0f / st[0].l;
            inv_l[1] = 1.0f / st[1].l;
        }
    }

    // Zeros past the last chunk (all above the diagonal): the row group's
    // parts share each of its rows.
    const int zero_from = chunks * S::CHUNK;
    for (int rr = 0; rr < 16; ++rr) {
        const int i = wr + rr;
        if (i >= seq) break;
        float* pr = probs + att_p_at(b, h, i, seq, heads);
        for (int j = zero_from + 32 * ln.kh + threadIdx.x % 32; j < seq; j += 32 * S::SPLIT)
            pr[j] = 0.0f;
    }
    tc_sum_split<D>(acc, tc_smem, ln.kh);
    if (ln.kh != 0) return;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (row[r] >= seq) continue;
        const size_t o_row = att_q_at(b, row[r], h, seq, heads, head_dim);
#pragma unroll
        for (int nd = 0; nd < S::KT; ++nd)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int col = 8 * nd + 2 * ln.t + e;
                const size_t idx = o_row + col;
                if (col < head_dim && (long long)idx < write_limit) out[idx] = acc[nd][2 * r + e];
            }
    }
}

// D_r = <dout_i, out_i> of the thread's rows g and g + 8 of its row group
// (dout rows staged at `rows`, LDK apart, in f32): lanes 2 rr and 2 rr + 1
// sum the halves of row rr, so every load of the warp is independent; the
// sums reach the lanes that need them by shuffles.
template <int D>
__device__ __forceinline__ void tc_row_dots(const float* rows, const float* __restrict__ out,
                                            int b, int wr, int h, int seq, int heads,
                                            int head_dim, int g, float (&d_row)[2]) {
    const int lane = threadIdx.x % 32;
    const int rr = lane / 2;
    const int c0 = (lane % 2) * (D / 2);
    float part = 0.0f;
    if (wr + rr < seq) {
        const float* o = out + att_q_at(b, wr + rr, h, seq, heads, head_dim);
#pragma unroll 8
        for (int c = c0; c < c0 + D / 2; ++c)
            if (c < head_dim) part = fmaf(rows[rr * TcShape<D>::LDK + c], o[c], part);
    }
    part += __shfl_xor_sync(0xffffffffu, part, 1);
    d_row[0] = __shfl_sync(0xffffffffu, part, 2 * g);
    d_row[1] = __shfl_sync(0xffffffffu, part, 2 * (g + 8));
}

// Backward, part 1: dS (into ds, entries j <= i) and dq for TC_ROWS query
// rows, one pass over the keys: dP = dout v^T, dS = P (dP - D), dq += dS k,
// each warp on its part of every key chunk. Grid, block and shared memory
// as the forward.
template <int D>
__device__ __forceinline__ void attention_tc_dq(const float* __restrict__ k,
                                                const float* __restrict__ v,
                                                const float* __restrict__ probs,
                                                const float* __restrict__ out,
                                                const float* __restrict__ dout,
                                                float* __restrict__ dq, float* __restrict__ ds,
                                                int batch, int seq, int heads, int kv_heads,
                                                int head_dim, float scale) {
    using S = TcShape<D>;
    extern __shared__ __align__(16) float tc_smem[];
    const int r0 = (gridDim.x - 1 - blockIdx.x) * TC_ROWS;
    const int h = blockIdx.y;
    const int b = blockIdx.z;
    if (r0 >= seq || h >= heads || b >= batch) return;
    const int kvh = h / (heads / kv_heads);
    const TcLane ln;
    const int wr = r0 + 16 * ln.rg;
    const int row[2] = {wr + ln.g, wr + ln.g + 8};
    const int key_end = min(seq, r0 + TC_ROWS);
    const int chunks = (key_end + S::CHUNK - 1) / S::CHUNK;
    const int koff = 8 * S::NH * ln.kh;
    const size_t kv_stride = (size_t)kv_heads * head_dim;
    const size_t q_stride = (size_t)heads * head_dim;
    const bool vec = head_dim % 4 == 0 && aligned16(dout) && aligned16(k) && aligned16(v);
    const float* kb = k + att_kv_at(b, 0, kvh, seq, kv_heads, head_dim);
    const float* vb = v + att_kv_at(b, 0, kvh, seq, kv_heads, head_dim);

    // dout rows as A operands, and D_i = <dout_i, out_i> of the thread's rows
    // (from the f32 rows, before they are rounded).
    float da[S::KT][4];
    float d_row[2];
    {
        const TcTile<D, TC_ROWS, S::LDK> td{tc_smem};
        td.stage(dout + att_q_at(b, r0, h, seq, heads, head_dim), q_stride, seq - r0, head_dim,
                 vec);
        tc_commit();
        tc_wait_all();
        __syncthreads();
        const float* mine = tc_smem + 16 * ln.rg * S::LDK;
        tc_row_dots<D>(mine, out, b, wr, h, seq, heads, head_dim, ln.g, d_row);
        __syncthreads();
        td.round(vec);
        __syncthreads();
        tc_load_a<D>(mine, ln.g, ln.t, da);
        __syncthreads();
    }

    float acc[S::KT][4];
#pragma unroll
    for (int nd = 0; nd < S::KT; ++nd)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nd][e] = 0.0f;
    const bool pairs = seq % 2 == 0;
    size_t p_row[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) p_row[r] = att_p_at(b, h, min(row[r], seq - 1), seq, heads);
    // v is read k-style (dP = dout v^T), k v-style (dq = dS k).
    const TcTile<D, S::CHUNK, S::LDK> vt{tc_smem};
    const TcTile<D, S::CHUNK, S::LDV> kt{tc_smem + S::BUF};
    vt.stage(vb, kv_stride, seq, head_dim, vec);
    tc_commit();
    kt.stage(kb, kv_stride, seq, head_dim, vec);
    tc_commit();
    // This warp's probabilities of chunk c (masked entries: 0), loaded one
    // chunk ahead so their latency overlaps a whole chunk's work.
    auto load_probs = [&](int c, float (&w)[S::NH][4]) {
        const int j0 = c * S::CHUNK + koff;
#pragma unroll
        for (int n = 0; n < S::NH; ++n)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int j = j0 + 8 * n + 2 * ln.t;
                const bool in = row[r] < seq && j <= row[r];
                if (pairs && in) {
                    const float2 p2 = *reinterpret_cast<const float2*>(probs + p_row[r] + j);
                    w[n][2 * r] = p2.x;
                    w[n][2 * r + 1] = j + 1 <= row[r] ? p2.y : 0.0f;
                } else {
                    w[n][2 * r] = in ? probs[p_row[r] + j] : 0.0f;
                    w[n][2 * r + 1] = in && j + 1 <= row[r] ? probs[p_row[r] + j + 1] : 0.0f;
                }
            }
    };
    float wn[S::NH][4];
    load_probs(0, wn);
    for (int c = 0; c < chunks; ++c) {
        const int j0 = c * S::CHUNK + koff;  // this warp's first key of the chunk
        const int next = c * S::CHUNK + S::CHUNK;
        float w[S::NH][4];
#pragma unroll
        for (int n = 0; n < S::NH; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) w[n][e] = wn[n][e];
        load_probs(c + 1, wn);  // past the last chunk every entry is masked
        tc_wait_prev();  // v of chunk c
        vt.round(vec);
        __syncthreads();
        float dp[S::NH][4];
        tc_scores<D>(da, vt.s + koff * S::LDK, ln.g, ln.t, dp);
        __syncthreads();
        if (c + 1 < chunks) vt.stage(vb + next * kv_stride, kv_stride, seq - next, head_dim, vec);
        tc_commit();
#pragma unroll
        for (int n = 0; n < S::NH; ++n) {
            const int j = j0 + 8 * n + 2 * ln.t;
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                // Masked entries have P = 0, so dS = 0 there.
                w[n][2 * r] *= dp[n][2 * r] - d_row[r];
                w[n][2 * r + 1] *= dp[n][2 * r + 1] - d_row[r];
                if (row[r] < seq && j <= row[r])
                    tc_store2(ds + p_row[r] + j, w[n][2 * r], w[n][2 * r + 1], pairs,
                              j + 1 <= row[r]);
            }
        }
        tc_wait_prev();  // k of chunk c
        kt.round(vec);
        __syncthreads();
        tc_accumulate<D>(w, kt.s + koff * S::LDV, ln.g, ln.t, acc);
        __syncthreads();
        if (c + 1 < chunks) kt.stage(kb + next * kv_stride, kv_stride, seq - next, head_dim, vec);
        tc_commit();
    }
    tc_sum_split<D>(acc, tc_smem, ln.kh);
    if (ln.kh != 0) return;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (row[r] >= seq) continue;
        const size_t o_row = att_q_at(b, row[r], h, seq, heads, head_dim);
#pragma unroll
        for (int nd = 0; nd < S::KT; ++nd)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int col = 8 * nd + 2 * ln.t + e;
                if (col < head_dim) dq[o_row + col] = scale * acc[nd][2 * r + e];
            }
    }
}

// The A operands of dS^T and P^T for QH 8-query steps from query i0, in f32:
// rows = the warp's keys kr[0], kr[1] (g and g + 8), k index t / t + 4 =
// query i0 + 8 qt + 2t / + 1 (the k order above), masked to i >= j, i < seq.
template <int D>
__device__ __forceinline__ void tc_load_dkv_a(const float* __restrict__ ds,
                                              const float* __restrict__ probs, size_t plane,
                                              int seq, int i0, const int (&kr)[2], int t,
                                              float (&sa)[TcShape<D>::QH][4],
                                              float (&pa)[TcShape<D>::QH][4]) {
#pragma unroll
    for (int qt = 0; qt < TcShape<D>::QH; ++qt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = i0 + 8 * qt + 2 * t + e / 2;  // a0, a1: query 2t; a2, a3: 2t + 1
            const int j = kr[e % 2];                    // a0, a2: key g; a1, a3: g + 8
            float sv = 0.0f;
            float pv = 0.0f;
            if (i < seq && j < seq && i >= j) {
                const size_t at = plane + (size_t)i * seq + j;
                sv = ds[at];
                pv = probs[at];
            }
            sa[qt][e] = sv;
            pa[qt][e] = pv;
        }
}

// Backward, part 2: one query head's share of dk and dv (pk, pv) for TC_ROWS
// key rows, over the query rows i >= the tile's first key in chunks of
// QCHUNK, each warp on its part (QH steps) of every chunk:
// pk_j = sum_i dS_ij q_i, pv_j = sum_i P_ij dout_i. The dS and P entries go
// from global memory straight into A operands (a warp's load covers 32-byte
// pieces of 4 rows), one chunk ahead; q and dout chunks are staged v-style,
// two stages. Grid (ceil(seq / TC_ROWS), heads, batch), THREADS threads,
// SMEM_FLOATS of dynamic shared memory.
template <int D>
__device__ __forceinline__ void attention_tc_dkv(const float* __restrict__ q,
                                                 const float* __restrict__ dout,
                                                 const float* __restrict__ probs,
                                                 const float* __restrict__ ds,
                                                 float* __restrict__ pk, float* __restrict__ pv,
                                                 int batch, int seq, int heads, int head_dim) {
    using S = TcShape<D>;
    using Tile = TcTile<D, S::QCHUNK, S::LDV>;
    extern __shared__ __align__(16) float tc_smem[];
    const int j0 = blockIdx.x * TC_ROWS;
    const int h = blockIdx.y;
    const int b = blockIdx.z;
    if (j0 >= seq || h >= heads || b >= batch) return;
    const TcLane ln;
    const int wj = j0 + 16 * ln.rg;
    const int kr[2] = {wj + ln.g, wj + ln.g + 8};
    const int qoff = 8 * S::QH * ln.kh;  // this warp's first query of a chunk
    const size_t q_stride = (size_t)heads * head_dim;
    const size_t plane = att_p_at(b, h, 0, seq, heads);
    const bool vec = head_dim % 4 == 0 && aligned16(q) && aligned16(dout);
    const float* qb = q + att_q_at(b, 0, h, seq, heads, head_dim);
    const float* db = dout + att_q_at(b, 0, h, seq, heads, head_dim);
    const int chunks = (seq - j0 + S::QCHUNK - 1) / S::QCHUNK;
    constexpr int TILE = S::QCHUNK * S::LDV;
    // Stage s (chunk c in stage c % 2): q rows at tc_smem + 2 s TILE, dout
    // rows right after.
    auto stage = [&](int c) {
        const int i0 = j0 + c * S::QCHUNK;
        float* at = tc_smem + (c & 1) * 2 * TILE;
        Tile{at}.stage(qb + i0 * q_stride, q_stride, seq - i0, head_dim, vec);
        Tile{at + TILE}.stage(db + i0 * q_stride, q_stride, seq - i0, head_dim, vec);
    };

    float ka[S::KT][4], va[S::KT][4];
#pragma unroll
    for (int nd = 0; nd < S::KT; ++nd)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            ka[nd][e] = 0.0f;
            va[nd][e] = 0.0f;
        }
    float sa[S::QH][4], pa[S::QH][4];
    tc_load_dkv_a<D>(ds, probs, plane, seq, j0 + qoff, kr, ln.t, sa, pa);
    stage(0);
    tc_commit();
    for (int c = 0; c < chunks; ++c) {
        const int i0 = j0 + c * S::QCHUNK;
        if (c + 1 < chunks) stage(c + 1);
        tc_commit();
        float sn[S::QH][4], pn[S::QH][4];
        tc_load_dkv_a<D>(ds, probs, plane, seq, i0 + S::QCHUNK + qoff, kr, ln.t, sn, pn);
        tc_wait_prev();
        const Tile qt_{tc_smem + (c & 1) * 2 * TILE};
        const Tile dt_{qt_.s + TILE};
        qt_.round(vec);
        dt_.round(vec);
        __syncthreads();
#pragma unroll
        for (int qt = 0; qt < S::QH; ++qt) {
            float as[4], ap[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                as[e] = tc_tf32(sa[qt][e]);
                ap[e] = tc_tf32(pa[qt][e]);
            }
            const int at = (qoff + 8 * qt + 2 * ln.t) * S::LDV + ln.g;
            const float* qr = qt_.s + at;
            const float* dr = dt_.s + at;
#pragma unroll
            for (int nd = 0; nd < S::KT; ++nd) {
                tc_mma(ka[nd], as, qr[8 * nd], qr[S::LDV + 8 * nd]);
                tc_mma(va[nd], ap, dr[8 * nd], dr[S::LDV + 8 * nd]);
            }
        }
        __syncthreads();  // this stage is refilled at c + 1
#pragma unroll
        for (int qt = 0; qt < S::QH; ++qt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                sa[qt][e] = sn[qt][e];
                pa[qt][e] = pn[qt][e];
            }
    }
    tc_sum_split<D>(ka, tc_smem, ln.kh);
    tc_sum_split<D>(va, tc_smem, ln.kh);
    if (ln.kh != 0) return;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (kr[r] >= seq) continue;
        const size_t o_row = att_q_at(b, kr[r], h, seq, heads, head_dim);
#pragma unroll
        for (int nd = 0; nd < S::KT; ++nd)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int col = 8 * nd + 2 * ln.t + e;
                if (col < head_dim) {
                    pk[o_row + col] = ka[nd][2 * r + e];
                    pv[o_row + col] = va[nd][2 * r + e];
                }
            }
    }
}

#define ATT_TC_BOUNDS(D) __launch_bounds__(TcShape<D>::THREADS, TcShape<D>::MIN_BLOCKS)
#define ATT_TC_FWD(D) ATT_FWD_ENTRY(attention_tc, attention_tc_fwd, ATT_TC_BOUNDS, D)
#define ATT_TC_DQ(D) ATT_DQ_ENTRY(attention_tc, attention_tc_dq, ATT_TC_BOUNDS, D)
#define ATT_TC_DKV(D) ATT_DKV_ENTRY(attention_tc, attention_tc_dkv, ATT_TC_BOUNDS, D)

// ---- bf16 flash kernels ------------------------------------------------------
//
// The same attention with bf16 products on the tensor cores (mma.sync
// m16n8k16, f32 accumulation, f32 softmax) and, as FlashAttention-2 does, no
// probabilities saved: the forward keeps each row's log-sum-exp and the
// backward recomputes P from it.
//
// Rounding points (the oracle's `bf16 at the same points` rounds the same
// values): q, k and v arrive in bf16 (their producer, the step's q/k/v
// epilogue, rounds them to nearest even); dout is rounded to bf16 as it is
// staged in shared memory; the scores, the softmax, its sums and the row dots D are f32; the
// unnormalised p = 2^(s c - m) is rounded to bf16 as the A operand of P V and
// of P^T dout, and dS as the A operand of dS k and dS^T q. out, dq and the
// dk/dv shares are f32.
//
// In log2 units: with c = scale log2(e) and a row's running maximum m of the
// raw scores s = <q_i, k_j>, p = 2^(s c - m c) (one FFMA and MUFU.EX2), and
// lse2_i = m c + log2(l_i) is what the forward saves (`lse`,
// [batch, heads, seq]), so the backward's P_ij = 2^(s c - lse2_i).
//
// Backward (deterministic, no atomics), from lse and out:
//   D_i = <dout_i, out_i> (f32, from f32 out and dout), dP_ij = <dout_i, v_j>,
//   dS_ij = P_ij (dP_ij - D_i); a first kernel writes D to `dd`; the dkv
//   kernel walks the queries of 64 key rows for one query head, writes that
//   head's share of dk (before the scale) and of dv to pk, pv, which kv_sum
//   adds as for the other kernels, and stores dS,
//   rounded to bf16, transposed (`dst`, [batch, heads, key j, query i], rows
//   of `ds_stride` = seq rounded up to 8, so every row starts 16-byte
//   aligned); the dq kernel then multiplies it: dq = scale dS k, walking the
//   keys of 64 query rows. dS is computed once, not again for dq, and the
//   dq kernel reads it with cp.async, as stored. The rounding is the one dS
//   gets as an mma operand either way; entries of dst the dkv kernel does
//   not write (j > i past a warp's keys, keys or queries past seq) are
//   never used: the dq kernel zeroes them in its registers.
//
// Tiling: 4 warps, 16 rows each (query rows in the forward and dq, key rows
// in dk/dv); the other dimension is walked in chunks staged in shared memory
// as bf16, rows padded by 8 elements (16 bytes), so the 8 row addresses of
// an ldmatrix phase fall in distinct 16-byte bank groups. Operands are read
// with ldmatrix: plain for the operand whose rows are the mma's n (k in q k^T),
// transposed for the one whose rows are the mma's k (v in P v). With the
// m16n8k16 layouts (g = lane / 4, t = lane % 4), an accumulator pair of two
// 8-wide n tiles is the A operand of the next product as it is, packed to
// bf16x2: P v and dS k take P and dS straight from registers.
//
// The forward holds the warp's q rows as A fragments in registers, loaded
// once; the dkv kernel reads its k and v rows from shared memory each chunk
// (at head_dim 128 they would not fit in registers beside the dk and dv
// accumulators), and the dq kernel its dS rows, transposed as stored.

#define FL_WARPS 4
#define FL_THREADS (32 * FL_WARPS)
#define FL_ROWS (16 * FL_WARPS)

// Two builds of the three flash kernels. The aligned one (FL_ALIGNED 1:
// the modules attention_flash_{fwd,dq,dkv}_dXX, what a model's step takes)
// is launched only where head_dim is a multiple of 8 and every tensor
// starts 16-byte aligned (ops/attention.rs checks the addresses), so every
// row moves in its widest pieces: each FL_WIDE condition below holds, and
// the ways that move a row one value at a time are not compiled. NVRTC
// compiles these modules, the slowest of a bf16 pre-warm, in about half the
// time then. The other build (FL_ALIGNED 0: attention_flash_any_dXX, all
// three kernels) tests each condition at run time, for any head_dim and
// alignment. Both compute the same values in the same order.
#ifndef FL_ALIGNED
#define FL_ALIGNED 0
#endif
#define FL_WIDE(cond) (FL_ALIGNED || (cond))

template <int D>
struct FlShape {
    static constexpr int LD = D + 8;                 // bf16 per shared-memory row
    static constexpr int KT = D / 16;                // 16-wide k steps of head_dim
    static constexpr int DT = D / 8;                 // 8-wide n tiles of head_dim
    static constexpr int CHUNK = D <= 64 ? 64 : 32;  // keys per chunk (fwd)
    static constexpr int NT = CHUNK / 8;
    static constexpr int QCHUNK = D <= 64 ? 32 : 16; // queries per chunk (dkv)
    static constexpr int QNT = QCHUNK / 8;
    // Keys per chunk of the dq kernel, which multiplies the stored dS; its
    // dS tiles are FL_ROWS queries wide, rows padded by 8 as the others.
    static constexpr int DS_CHUNK = D <= 64 ? 64 : 32;
    static constexpr int DS_LD = FL_ROWS + 8;
    // Shared memory, in bytes. Forward: two stages, each a key chunk (k,
    // then v) or, before the first chunk's multiply, the q tile.
    __host__ __device__ static constexpr int area(int chunk) {
        return 2 * (FL_ROWS * LD > 2 * chunk * LD ? FL_ROWS * LD : 2 * chunk * LD);
    }
    static constexpr int STAGE = area(CHUNK) / 2;  // bf16 per stage
    static constexpr int FWD_SMEM = 2 * area(CHUNK);
    // dq: two stages of a k chunk and its dS tile (the next chunk's copied
    // while this one is multiplied).
    static constexpr int DQ_SMEM = 2 * (2 * DS_CHUNK * LD + 2 * DS_CHUNK * DS_LD);
    // dkv: the k and v tiles, a q and a dout chunk, and lse2 and D of the chunk.
    static constexpr int DKV_SMEM = 2 * (2 * FL_ROWS * LD + 2 * QCHUNK * LD) + 8 * QCHUNK;
};
// The launchers pass these (ops/attention.rs, flash_smem).
static_assert(FlShape<64>::FWD_SMEM == 36864 && FlShape<128>::FWD_SMEM == 34816, "fwd smem");
static_assert(FlShape<64>::DQ_SMEM == 36864 && FlShape<128>::DQ_SMEM == 26624, "dq smem");
static_assert(FlShape<64>::DKV_SMEM == 27904 && FlShape<128>::DKV_SMEM == 43648, "dkv smem");

// {lo, hi} rounded to bf16 (nearest, ties to even) and packed, lo in the
// lower half, as an mma operand register holds two consecutive k.
__device__ __forceinline__ unsigned fl_pack(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// d += a b on one 16 x 8 x 16 tile of bf16 operands.
__device__ __forceinline__ void fl_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                       unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8 x 8 bf16 matrices from shared memory; lane l gives the address of
// row l % 8 of matrix l / 8. Plain: lane (g, t) gets row g, columns 2t and
// 2t + 1 of each; transposed: rows 2t and 2t + 1 of column g.
__device__ __forceinline__ void fl_ldm(unsigned (&r)[4], const unsigned short* p) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s)
                 : "memory");
}
__device__ __forceinline__ void fl_ldm_t(unsigned (&r)[4], const unsigned short* p) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s)
                 : "memory");
}

// The A fragment of rows r0..r0 + 15, columns k0..k0 + 15 of a tile (rows
// of LD): matrices (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15).
template <int LD>
__device__ __forceinline__ void fl_a(unsigned (&a)[4], const unsigned short* tile, int r0, int k0) {
    const int l = threadIdx.x & 31;
    fl_ldm(a, tile + (r0 + (l & 7) + 8 * ((l >> 3) & 1)) * LD + k0 + 8 * (l >> 4));
}

// B fragments of two 8-wide n tiles n0 and n0 + 8 over k0..k0 + 15, from a
// tile whose rows are the n (plain): {b0, b1} of n0 in r[0], r[1], of n0 + 8
// in r[2], r[3].
template <int LD>
__device__ __forceinline__ void fl_b_rows_n(unsigned (&r)[4], const unsigned short* tile, int n0,
                                            int k0) {
    const int l = threadIdx.x & 31;
    fl_ldm(r, tile + (n0 + (l & 7) + 8 * (l >> 4)) * LD + k0 + 8 * ((l >> 3) & 1));
}

// The same from a tile whose rows are the k (transposed).
template <int LD>
__device__ __forceinline__ void fl_b_rows_k(unsigned (&r)[4], const unsigned short* tile, int n0,
                                            int k0) {
    const int l = threadIdx.x & 31;
    fl_ldm_t(r, tile + (k0 + (l & 7) + 8 * ((l >> 3) & 1)) * LD + n0 + 8 * (l >> 4));
}

// Where pack u of a thread's share of a staged tile lies: row n, columns c
// to c + 3. Thread t holds the packs t, t + FL_THREADS, ... of the tile in
// row-major order, so a warp reads consecutive packs of a row.
template <int D>
__device__ __forceinline__ void fl_pack_slot(int u, int& n, int& c) {
    const int e = threadIdx.x + u * FL_THREADS;
    n = e / (D / 4);
    c = 4 * (e % (D / 4));
}

// A thread's share of ROWS rows of a head_dim-wide f32 tensor, held in
// registers between the load from global memory and the store to a bf16 tile
// in shared memory, so a chunk's loads can be in flight while the chunk
// before it is multiplied. load(): rows n < valid (row n at src + n *
// stride); rows past valid and columns past head_dim are zeros. `vec`: rows
// move as float4 (head_dim a multiple of 4 and src 16-byte aligned).
// store(): the values rounded to bf16 into the tile (rows of D + 8).
template <int D, int ROWS>
struct FlRows {
    static constexpr int N = ROWS * D / 4 / FL_THREADS;  // float4s per thread
    static_assert(ROWS * D / 4 % FL_THREADS == 0, "whole float4s per thread");
    float4 x[N];

    __device__ __forceinline__ void load(const float* __restrict__ src, size_t stride, int valid,
                                         int head_dim, bool vec) {
#pragma unroll
        for (int u = 0; u < N; ++u) {
            int n, c;
            fl_pack_slot<D>(u, n, c);
            x[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (n < valid) {
                const float* p = src + (size_t)n * stride + c;
                if (vec) {
                    if (c < head_dim) x[u] = *reinterpret_cast<const float4*>(p);
                } else {
                    if (c < head_dim) x[u].x = p[0];
                    if (c + 1 < head_dim) x[u].y = p[1];
                    if (c + 2 < head_dim) x[u].z = p[2];
                    if (c + 3 < head_dim) x[u].w = p[3];
                }
            }
        }
    }

    __device__ __forceinline__ void store(unsigned short* tile) const {
#pragma unroll
        for (int u = 0; u < N; ++u) {
            int n, c;
            fl_pack_slot<D>(u, n, c);
            *reinterpret_cast<uint2*>(tile + n * (D + 8) + c) =
                make_uint2(fl_pack(x[u].x, x[u].y), fl_pack(x[u].z, x[u].w));
        }
    }
};

// FlRows for rows already in bf16 (q, k and v as the bf16 step's q/k/v
// epilogue rounds them, where these kernels would round them as they stage
// them): four values, 8 bytes, at a time, stored to the tile as they are.
// `vec`: head_dim a multiple of 4 and src 8-byte aligned.
template <int D, int ROWS>
struct FlRows16 {
    static constexpr int N = ROWS * D / 4 / FL_THREADS;  // packs of four per thread
    static_assert(ROWS * D / 4 % FL_THREADS == 0, "whole packs per thread");
    uint2 x[N];

    __device__ __forceinline__ void load(const unsigned short* __restrict__ src, size_t stride,
                                         int valid, int head_dim, bool vec) {
#pragma unroll
        for (int u = 0; u < N; ++u) {
            int n, c;
            fl_pack_slot<D>(u, n, c);
            x[u] = make_uint2(0u, 0u);
            if (n < valid && c < head_dim) {
                const unsigned short* p = src + (size_t)n * stride + c;
                if (vec) {
                    x[u] = *reinterpret_cast<const uint2*>(p);
                } else {
                    unsigned h[4] = {0u, 0u, 0u, 0u};
#pragma unroll
                    for (int i = 0; i < 4; ++i)
                        if (c + i < head_dim) h[i] = p[i];
                    x[u] = make_uint2(h[0] | (h[1] << 16), h[2] | (h[3] << 16));
                }
            }
        }
    }

    __device__ __forceinline__ void store(unsigned short* tile) const {
#pragma unroll
        for (int u = 0; u < N; ++u) {
            int n, c;
            fl_pack_slot<D>(u, n, c);
            *reinterpret_cast<uint2*>(tile + n * (D + 8) + c) = x[u];
        }
    }
};

// Columns col and col + 1 (even) of a row, x and y, those below head_dim
// and limit (the elements of the row that may be written): one 8-byte store
// when both are and `pair` (the row 8-byte aligned), else one at a time.
__device__ __forceinline__ void fl_store_pair(float* row, int col, float x, float y, int head_dim,
                                              long long limit, bool pair) {
    if (pair && col + 1 < head_dim && col + 1 < limit) {
        *reinterpret_cast<float2*>(row + col) = make_float2(x, y);
        return;
    }
    if (col < head_dim && col < limit) row[col] = x;
    if (col + 1 < head_dim && col + 1 < limit) row[col + 1] = y;
}

// fl_store_pair's values rounded to bf16 (as the cast kernels round) into
// a row of bf16: one 4-byte store when both are written and `pair` (the
// row 4-byte aligned).
__device__ __forceinline__ void fl_store_pair16(unsigned short* row, int col, float x, float y,
                                                int head_dim, long long limit, bool pair) {
    const unsigned short hx = f32_to_bf16_bits(x), hy = f32_to_bf16_bits(y);
    if (pair && col + 1 < head_dim && col + 1 < limit) {
        *reinterpret_cast<unsigned*>(row + col) = (unsigned)hx | ((unsigned)hy << 16);
        return;
    }
    if (col < head_dim && col < limit) row[col] = hx;
    if (col + 1 < head_dim && col + 1 < limit) row[col + 1] = hy;
}

// Starts copying ROWS rows of a bf16 tensor (row n at src + n * stride,
// head_dim values) into a tile of D + 8-wide rows, with cp.async in 16-byte
// pieces; the caller commits them. Rows n >= valid and columns past head_dim
// become zeros and read nothing (their source is src itself, which exists).
// Needs head_dim % 8 == 0 and every row 16-byte aligned.
template <int D, int ROWS>
__device__ __forceinline__ void fl_stage16(unsigned short* tile,
                                           const unsigned short* __restrict__ src, size_t stride,
                                           int valid, int head_dim) {
    constexpr int PIECES = D / 8;  // per row
    static_assert(ROWS * PIECES % FL_THREADS == 0, "whole pieces per thread");
#pragma unroll
    for (int u = 0; u < ROWS * PIECES / FL_THREADS; ++u) {
        const int e = threadIdx.x + u * FL_THREADS;
        const int n = e / PIECES, c = 8 * (e % PIECES);
        const bool ok = n < valid && c < head_dim;
        const unsigned short* from = ok ? src + (size_t)n * stride + c : src;
        const unsigned to = (unsigned)__cvta_generic_to_shared(tile + n * (D + 8) + c);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(to), "l"(from),
                     "r"(ok ? 16 : 0));
    }
}

// fl_stage16's rows copied one value at a time, at once (no cp.async), for
// rows that cannot move in 16-byte pieces. Kept small: no kernel of the
// step takes this way.
template <int D, int ROWS>
__device__ __forceinline__ void fl_stage_each(unsigned short* tile,
                                              const unsigned short* __restrict__ src,
                                              size_t stride, int valid, int head_dim) {
#pragma unroll 1
    for (int e = threadIdx.x; e < ROWS * D; e += FL_THREADS) {
        const int n = e / D, c = e % D;
        tile[n * (D + 8) + c] = n < valid && c < head_dim ? src[(size_t)n * stride + c] : 0;
    }
}

__device__ __forceinline__ bool aligned8(const void* p) {
    return ((unsigned long long)p & 7ull) == 0;
}

// The A fragments of the warp's 16 rows of a staged tile, all of head_dim.
template <int D>
__device__ __forceinline__ void fl_row_frags(unsigned (&a)[FlShape<D>::KT][4],
                                             const unsigned short* tile) {
    const int r0 = 16 * (threadIdx.x >> 5);
#pragma unroll
    for (int ks = 0; ks < FlShape<D>::KT; ++ks) fl_a<FlShape<D>::LD>(a[ks], tile, r0, 16 * ks);
}

// s[n][.] = the warp's 16 rows (A fragments a) times the CHUNK rows of a
// tile read plain (k in q k^T, v in dout v^T): 16 x CHUNK scores.
template <int D, int N>
__device__ __forceinline__ void fl_scores(float (&s)[N][4], const unsigned (&a)[FlShape<D>::KT][4],
                                          const unsigned short* tile) {
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < FlShape<D>::KT; ++ks)
#pragma unroll
        for (int n = 0; n < N; n += 2) {
            unsigned b[4];
            fl_b_rows_n<FlShape<D>::LD>(b, tile, 8 * n, 16 * ks);
            fl_mma(s[n], a[ks], b[0], b[1]);
            fl_mma(s[n + 1], a[ks], b[2], b[3]);
        }
}

// acc[dt][.] += w (16 x 8N, in accumulator layout) times N * 8 rows of a
// tile read transposed (v in P v, k in dS k): 16 x head_dim.
template <int D, int N>
__device__ __forceinline__ void fl_accumulate(float (&acc)[FlShape<D>::DT][4],
                                              const float (&w)[N][4], const unsigned short* tile) {
#pragma unroll
    for (int kk = 0; kk < N / 2; ++kk) {
        const unsigned a[4] = {fl_pack(w[2 * kk][0], w[2 * kk][1]),
                               fl_pack(w[2 * kk][2], w[2 * kk][3]),
                               fl_pack(w[2 * kk + 1][0], w[2 * kk + 1][1]),
                               fl_pack(w[2 * kk + 1][2], w[2 * kk + 1][3])};
#pragma unroll
        for (int dt = 0; dt < FlShape<D>::DT; dt += 2) {
            unsigned b[4];
            fl_b_rows_k<FlShape<D>::LD>(b, tile, 8 * dt, 16 * kk);
            fl_mma(acc[dt], a, b[0], b[1]);
            fl_mma(acc[dt + 1], a, b[2], b[3]);
        }
    }
}

// The block's work: its tile's rank by weight (0 = the most rows to walk)
// and its head and batch. A tile of causal attention walks more of the
// other side the further it is from the start of the diagonal, so tiles
// differ several-fold in work. The hardware hands blocks out in order of
// their linear index and, on an idle GPU, spreads them over the SMs before
// it gives any a second (ncu timings bear this out, docs/src/performance/
// attention.md): so the first %nsmid blocks take the heaviest tiles in order
// and the rest the lightest first, and an SM running two blocks holds a
// heavy and a light one, where the grid order gave it two of one rank.
// Any order gives the same results; this one evens out the SMs' work.
__device__ __forceinline__ void fl_block_work(int& rank, int& h, int& b) {
    const int heads = gridDim.y, per_rank = gridDim.y * gridDim.z;
    const int blocks = gridDim.x * per_rank;
    const int linear = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned sms;
    asm("mov.u32 %0, %%nsmid;" : "=r"(sms));
    // A bijection of [0, blocks): the tail past the first sms reversed.
    const int at = linear < (int)sms ? linear : blocks + (int)sms - 1 - linear;
    rank = at / per_rank;
    h = at % per_rank % heads;
    b = at % per_rank / heads;
}

// Forward: out and lse for 64 query rows, and unless out16 is null out
// rounded to bf16 into it (the operand of the o projection's bf16 GEMM).
// Grid (ceil(seq / 64), heads, batch), blocks to tiles as fl_block_work
// says; FL_THREADS threads;
// FlShape<D>::FWD_SMEM bytes of dynamic shared memory.
template <int D>
__device__ void attention_flash_fwd(const unsigned short* __restrict__ q,
                                    const unsigned short* __restrict__ k,
                                    const unsigned short* __restrict__ v, float* __restrict__ out,
                                    float* __restrict__ lse, unsigned short* __restrict__ out16,
                                    int batch, int seq, int heads, int kv_heads, int head_dim,
                                    float scale, long long write_limit) {
    typedef FlShape<D> S;
    extern __shared__ __align__(16) unsigned short fl_smem[];
    // Launched as a programmatic dependent: q, k and v may be its
    // predecessor's output.
    wait_for_predecessor();
    int rank, h, b;
    fl_block_work(rank, h, b);
    const int i0 = FL_ROWS * (gridDim.x - 1 - rank);
    const int kvh = h / (heads / kv_heads);
    const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    const size_t q_stride = (size_t)heads * head_dim, kv_stride = (size_t)kv_heads * head_dim;
    const unsigned short* kb = k + att_kv_at(b, 0, kvh, seq, kv_heads, head_dim);
    const unsigned short* vb = v + att_kv_at(b, 0, kvh, seq, kv_heads, head_dim);
    const float c = scale * 1.4426950408889634f;

    // With 16-byte pieces (head_dim a multiple of 8, the tensors 16-byte
    // aligned) the rows are copied with cp.async into two stages: the next
    // chunk's k and v rows are in flight while this chunk is multiplied, and
    // the q tile and the first chunk arrive together. Otherwise each chunk
    // is loaded and stored in turn.
    const bool async16 = FL_WIDE(head_dim % 8 == 0 && aligned16(q) && aligned16(k) && aligned16(v));
    // Computed, not indexed from an array, which would live in local memory.
    const auto stage = [&](int i) { return fl_smem + i * S::STAGE; };
    const int keys = min(seq, i0 + FL_ROWS);
    const int chunks = (keys + S::CHUNK - 1) / S::CHUNK;
    const auto stage_chunk = [&](int ci) {
        unsigned short* ks = stage(ci & 1);
        const size_t at = (size_t)ci * S::CHUNK * kv_stride;
        fl_stage16<D, S::CHUNK>(ks, kb + at, kv_stride, seq - ci * S::CHUNK, head_dim);
        fl_stage16<D, S::CHUNK>(ks + S::CHUNK * S::LD, vb + at, kv_stride, seq - ci * S::CHUNK,
                                head_dim);
        tc_commit();
    };
    const unsigned short* qb = q + att_q_at(b, i0, h, seq, heads, head_dim);
    if (async16) {
        fl_stage16<D, FL_ROWS>(stage(1), qb, q_stride, seq - i0, head_dim);
        stage_chunk(0);
        tc_wait_all();
    } else {
        fl_stage_each<D, FL_ROWS>(stage(1), qb, q_stride, seq - i0, head_dim);
    }
    __syncthreads();
    unsigned qa[S::KT][4];
    fl_row_frags<D>(qa, stage(1));

    const int r0 = i0 + 16 * warp;            // the warp's first row
    const int row[2] = {r0 + g, r0 + g + 8};  // the thread's two rows
    float m[2] = {ATT_NEG_INF, ATT_NEG_INF}, l[2] = {0.0f, 0.0f};
    float o[S::DT][4];
#pragma unroll
    for (int dt = 0; dt < S::DT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[dt][e] = 0.0f;

    for (int ci = 0; ci < chunks; ++ci) {
        const int j0 = ci * S::CHUNK;
        unsigned short* ks = stage(ci & 1);
        unsigned short* vs = ks + S::CHUNK * S::LD;
        if (async16) {
            tc_wait_all();  // this thread's copies of the chunk have landed
            // Every thread's have, and every warp is done with the other
            // stage (the chunk before, or the q tile), which the next chunk
            // is copied into.
            __syncthreads();
            if (ci + 1 < chunks) stage_chunk(ci + 1);
        } else {
            __syncthreads();  // every warp is done with the stage
            const size_t at = (size_t)j0 * kv_stride;
            fl_stage_each<D, S::CHUNK>(ks, kb + at, kv_stride, seq - j0, head_dim);
            fl_stage_each<D, S::CHUNK>(vs, vb + at, kv_stride, seq - j0, head_dim);
            __syncthreads();
        }
        if (j0 > r0 + 15) continue;  // every key of the chunk is after every row of the warp
        float s[S::NT][4];
        fl_scores<D>(s, qa, ks);
        if (j0 + S::CHUNK - 1 > r0 || j0 + S::CHUNK > seq) {
#pragma unroll
            for (int n = 0; n < S::NT; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int j = j0 + 8 * n + 2 * t + (e & 1);
                    if (j > row[e >> 1] || j >= seq) s[n][e] = ATT_NEG_INF;
                }
        }
        float alpha[2], mc[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = m[r];
#pragma unroll
            for (int n = 0; n < S::NT; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            alpha[r] = tc_exp2((m[r] - mx) * c);
            m[r] = mx;
            mc[r] = mx * c;
            l[r] *= alpha[r];
        }
#pragma unroll
        for (int n = 0; n < S::NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[n][e] = tc_exp2(fmaf(s[n][e], c, -mc[e >> 1]));
                l[e >> 1] += s[n][e];
            }
#pragma unroll
        for (int dt = 0; dt < S::DT; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[dt][e] *= alpha[e >> 1];
        fl_accumulate<D>(o, s, vs);
    }

    // Row starts are 8-byte aligned when head_dim is even and out is (4-byte
    // for out16).
    const bool pairs = FL_WIDE(head_dim % 2 == 0 && aligned8(out));
    const bool pairs16 = FL_WIDE(head_dim % 2 == 0 && ((unsigned long long)out16 & 3ull) == 0);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        if (row[r] >= seq) continue;
        const float inv = 1.0f / l[r];
        const size_t at = att_q_at(b, row[r], h, seq, heads, head_dim);
#pragma unroll
        for (int dt = 0; dt < S::DT; ++dt) {
            const float x = o[dt][2 * r] * inv, y = o[dt][2 * r + 1] * inv;
            const int col = 8 * dt + 2 * t;
            const long long limit = write_limit - (long long)at;
            fl_store_pair(out + at, col, x, y, head_dim, limit, pairs);
            if (out16) fl_store_pair16(out16 + at, col, x, y, head_dim, limit, pairs16);
        }
        if (t == 0) lse[((size_t)b * heads + h) * seq + row[r]] = m[r] * c + __log2f(l[r]);
    }
}

// dst's 16-byte pieces of FL_ROWS queries (from i0) for `rows` keys (from
// j0), copied with cp.async into a tile of DS_LD-wide rows. A piece past
// seq (keys, or queries: a piece starts at a multiple of 8, so one that
// starts before seq lies inside the padded row) is zero-filled and reads
// nothing (its source is the head's first row).
template <int D, int ROWS>
__device__ __forceinline__ void fl_copy_ds(unsigned short* tile, const unsigned short* dst_h,
                                           int ds_stride, int j0, int i0, int seq) {
    constexpr int PIECES = FL_ROWS / 8;  // per key row
    static_assert(ROWS * PIECES % FL_THREADS == 0, "whole pieces per thread");
#pragma unroll
    for (int u = 0; u < ROWS * PIECES / FL_THREADS; ++u) {
        const int e = threadIdx.x + u * FL_THREADS;
        const int n = e / PIECES, c = 8 * (e % PIECES);
        const bool ok = j0 + n < seq && i0 + c < seq;
        const unsigned short* src = ok ? dst_h + (size_t)(j0 + n) * ds_stride + i0 + c : dst_h;
        const unsigned s = (unsigned)__cvta_generic_to_shared(tile + n * FlShape<D>::DS_LD + c);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src),
                     "r"(ok ? 16 : 0));
    }
    asm volatile("cp.async.commit_group;");
}

// The A fragment (rows: the warp's 16 queries from column m0 of a dS tile;
// columns: keys k0..k0 + 15, the tile's rows) of a tile stored key-major:
// ldmatrix transposed, lane l addressing key row k0 + l % 8 (+ 8 for
// matrices 2 and 3) at query column m0 (+ 8 for matrices 1 and 3).
template <int LDS>
__device__ __forceinline__ void fl_a_t(unsigned (&a)[4], const unsigned short* tile, int m0, int k0) {
    const int l = threadIdx.x & 31;
    fl_ldm_t(a, tile + (k0 + (l & 7) + 8 * (l >> 4)) * LDS + m0 + 8 * ((l >> 3) & 1));
}

// Zeroes the halves of an A fragment (rows i = row0 + g, + 8; columns j =
// col0 + 2t, + 1, + 8, + 9) whose key j is after the query i or past seq.
__device__ __forceinline__ void fl_mask_a(unsigned (&a)[4], int row0, int col0, int seq) {
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int i = row0 + g + 8 * (r & 1), j = col0 + 2 * t + 8 * (r >> 1);
        const unsigned lo = (j <= i && j < seq) ? 0x0000ffffu : 0u;
        const unsigned hi = (j + 1 <= i && j + 1 < seq) ? 0xffff0000u : 0u;
        a[r] &= lo | hi;
    }
}

// Backward, part 3: dq = scale dS k for 64 query rows, from the dS the dkv
// kernel stored (dst) and the kv head's k rows, the keys walked in chunks
// of DS_CHUNK in two stages: the next chunk's dS tile and k rows copied
// (cp.async) while this one is multiplied. Grid (ceil(seq / 64), heads,
// batch), blocks to tiles as fl_block_work says; DQ_SMEM bytes.
template <int D>
__device__ void attention_flash_dq(const unsigned short* __restrict__ dst,
                                   const unsigned short* __restrict__ k, float* __restrict__ dq,
                                   int batch, int seq, int ds_stride, int heads, int kv_heads,
                                   int head_dim, float scale) {
    typedef FlShape<D> S;
    extern __shared__ __align__(16) unsigned short fl_smem[];
    // Two stages, each a k chunk and its dS tile (computed, not indexed from
    // an array, which would live in local memory).
    const auto ks = [&](int stage) { return fl_smem + stage * S::DS_CHUNK * S::LD; };
    const auto dsb = [&](int stage) {
        return fl_smem + 2 * S::DS_CHUNK * S::LD + stage * S::DS_CHUNK * S::DS_LD;
    };
    int rank, h, b;
    fl_block_work(rank, h, b);
    const int i0 = FL_ROWS * (gridDim.x - 1 - rank);
    const int kvh = h / (heads / kv_heads);
    const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    const size_t kv_stride = (size_t)kv_heads * head_dim;
    const unsigned short* kb = k + att_kv_at(b, 0, kvh, seq, kv_heads, head_dim);
    const unsigned short* dst_h = dst + ((size_t)b * heads + h) * seq * ds_stride;
    const bool async16 = FL_WIDE(head_dim % 8 == 0 && aligned16(k));
    const int r0 = i0 + 16 * warp;
    float acc[S::DT][4];
#pragma unroll
    for (int dt = 0; dt < S::DT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[dt][e] = 0.0f;

    const int keys = min(seq, i0 + FL_ROWS);
    // k rows of the chunk from j0 into a stage: copied with cp.async (in the
    // group of the dS tile copied after them), or loaded and stored.
    const auto stage_k = [&](int j0, unsigned short* tile) {
        const unsigned short* src = kb + (size_t)j0 * kv_stride;
        if (async16) {
            fl_stage16<D, S::DS_CHUNK>(tile, src, kv_stride, seq - j0, head_dim);
        } else {
            fl_stage_each<D, S::DS_CHUNK>(tile, src, kv_stride, seq - j0, head_dim);
        }
    };
    // Launched as the dkv kernel's programmatic dependent: k is the forward's
    // input, copied while that kernel finishes; dS is its output. Once dkv's
    // writes are visible, the group sum (kv_sum, this kernel's dependent)
    // may start: it reads only dkv's shares.
    stage_k(0, ks(0));
    wait_for_predecessor();
    let_dependent_start();
    fl_copy_ds<D, S::DS_CHUNK>(dsb(0), dst_h, ds_stride, 0, i0, seq);
    for (int j0 = 0, cur = 0; j0 < keys; j0 += S::DS_CHUNK, cur ^= 1) {
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        // Every thread's copies of this chunk are visible, and every warp is
        // done with the other stage, which the next chunk is copied into.
        __syncthreads();
        const int next = j0 + S::DS_CHUNK;
        if (next < keys) {
            stage_k(next, ks(cur ^ 1));
            fl_copy_ds<D, S::DS_CHUNK>(dsb(cur ^ 1), dst_h, ds_stride, next, i0, seq);
        }
        if (j0 > r0 + 15) continue;  // every key of the chunk is after every row of the warp
        const bool edge = j0 + S::DS_CHUNK - 1 > r0 || j0 + S::DS_CHUNK > seq;
#pragma unroll
        for (int kk = 0; kk < S::DS_CHUNK / 16; ++kk) {
            unsigned a[4];
            fl_a_t<S::DS_LD>(a, dsb(cur), 16 * warp, 16 * kk);
            if (edge) fl_mask_a(a, r0, j0 + 16 * kk, seq);
#pragma unroll
            for (int dt = 0; dt < S::DT; dt += 2) {
                unsigned bb[4];
                fl_b_rows_k<S::LD>(bb, ks(cur), 8 * dt, 16 * kk);
                fl_mma(acc[dt], a, bb[0], bb[1]);
                fl_mma(acc[dt + 1], a, bb[2], bb[3]);
            }
        }
    }
    const int row[2] = {r0 + g, r0 + g + 8};
    const bool pairs = FL_WIDE(head_dim % 2 == 0 && aligned8(dq));
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (row[r] >= seq) continue;
        const size_t at = att_q_at(b, row[r], h, seq, heads, head_dim);
#pragma unroll
        for (int dt = 0; dt < S::DT; ++dt)
            fl_store_pair(dq + at, 8 * dt + 2 * t, scale * acc[dt][2 * r],
                          scale * acc[dt][2 * r + 1], head_dim, head_dim, pairs);
    }
}

// A warp's dS^T entries (accumulator layout: keys key[0], key[1]; queries
// c0 + 8n + 2t and + 1) rounded to bf16 into dst, row j (a key) at
// dst_h + j * ds_stride, both queries of a pair as one 4-byte store (ds_stride
// and c0 are even). Keys or queries past seq are not stored.
template <int NT>
__device__ __forceinline__ void fl_store_ds(unsigned short* dst_h, int ds_stride,
                                            const float (&dpt)[NT][4], const int (&key)[2],
                                            int c0, int seq) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int i = c0 + 8 * n + 2 * t;
            if (key[r] >= seq || i >= seq) continue;
            unsigned short* p = dst_h + (size_t)key[r] * ds_stride + i;
            const unsigned pair = fl_pack(dpt[n][2 * r], dpt[n][2 * r + 1]);
            if (i + 1 < seq) {
                *reinterpret_cast<unsigned*>(p) = pair;
            } else {
                *p = (unsigned short)(pair & 0xffffu);
            }
        }
}

// Backward, part 2: query head h's share of dk (before the scale) and of dv
// for 64 key rows, walking the queries i >= the tile's first key in chunks
// of QCHUNK; and dS of those keys and queries, rounded to bf16, into dst
// (transposed, rows of ds_stride). Grid (ceil(seq / 64), heads, batch),
// blocks to tiles as fl_block_work says; DKV_SMEM bytes.
template <int D>
__device__ void attention_flash_dkv(const unsigned short* __restrict__ q,
                                    const unsigned short* __restrict__ k,
                                    const unsigned short* __restrict__ v,
                                    const float* __restrict__ dout,
                                    const float* __restrict__ lse, const float* __restrict__ dd,
                                    float* __restrict__ pk, float* __restrict__ pv,
                                    unsigned short* __restrict__ dst, int batch, int seq,
                                    int ds_stride, int heads, int kv_heads, int head_dim,
                                    float scale) {
    typedef FlShape<D> S;
    extern __shared__ __align__(16) unsigned short fl_smem[];
    unsigned short* kt = fl_smem;
    unsigned short* vt = kt + FL_ROWS * S::LD;
    unsigned short* qs = vt + FL_ROWS * S::LD;       // the chunk's q rows
    unsigned short* dos = qs + S::QCHUNK * S::LD;    // ... and dout rows
    float* lse_s = reinterpret_cast<float*>(dos + S::QCHUNK * S::LD);  // ... their lse2
    float* d_s = lse_s + S::QCHUNK;                  // ... and D
    int rank, h, b;
    fl_block_work(rank, h, b);
    const int j0 = FL_ROWS * rank;
    const int kvh = h / (heads / kv_heads);
    const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    const size_t q_stride = (size_t)heads * head_dim, kv_stride = (size_t)kv_heads * head_dim;
    const bool vec = FL_WIDE(head_dim % 4 == 0 && aligned8(q) && aligned8(k) && aligned8(v));
    const bool dvec = FL_WIDE(head_dim % 4 == 0 && aligned16(dout));
    const float c = scale * 1.4426950408889634f;
    const size_t kv_first = att_kv_at(b, j0, kvh, seq, kv_heads, head_dim);
    const size_t stats = ((size_t)b * heads + h) * seq;
    unsigned short* dst_h = dst + ((size_t)b * heads + h) * seq * ds_stride;
    // The next chunk's q and dout rows, lse2 and D, loaded while this one is
    // multiplied. A query past seq gets lse2 = +inf, so its P is 0.
    FlRows16<D, S::QCHUNK> qn;
    FlRows<D, S::QCHUNK> dn;
    float lse_n = 0.0f, d_n = 0.0f;
    const auto fetch_rows = [&](int c0) {
        const size_t q_first = att_q_at(b, c0, h, seq, heads, head_dim);
        qn.load(q + q_first, q_stride, seq - c0, head_dim, vec);
        dn.load(dout + q_first, q_stride, seq - c0, head_dim, dvec);
    };
    const auto fetch_stats = [&](int c0) {
        const int i = c0 + threadIdx.x;
        if (threadIdx.x < S::QCHUNK) {
            lse_n = i < seq ? lse[stats + i] : __int_as_float(0x7f800000);
            d_n = i < seq ? dd[stats + i] : 0.0f;
        }
    };
    // k, v and the first chunk's q and dout rows are loaded before any is
    // stored: one memory latency, not three. In the 128 build, rows that
    // move in 16-byte pieces are copied with cp.async (the same tile: zeros
    // past seq and past head_dim): 32 packs a thread of register staging
    // were a fifth of NVRTC's time for the module, the slowest of a
    // head_dim-128 pre-warm. The 64 build keeps the register staging, which
    // measured a quarter of a microsecond faster there.
    if (D > 64 && FL_WIDE(head_dim % 8 == 0 && aligned16(k) && aligned16(v))) {
        fl_stage16<D, FL_ROWS>(kt, k + kv_first, kv_stride, seq - j0, head_dim);
        fl_stage16<D, FL_ROWS>(vt, v + kv_first, kv_stride, seq - j0, head_dim);
        asm volatile("cp.async.commit_group;");
        if (j0 < seq) fetch_rows(j0);
        asm volatile("cp.async.wait_group 0;" ::: "memory");
    } else {
        FlRows16<D, FL_ROWS> kr, vr;
        kr.load(k + kv_first, kv_stride, seq - j0, head_dim, vec);
        vr.load(v + kv_first, kv_stride, seq - j0, head_dim, vec);
        if (j0 < seq) fetch_rows(j0);
        kr.store(kt);
        vr.store(vt);
    }
    // Launched as the row dots' programmatic dependent: k, v, q and dout,
    // read so far while that kernel finishes, are not its output (and the
    // kernel before it, which may write dout, is done: the dots kernel
    // waited for it). D is its output, and everything after reads D or
    // writes.
    wait_for_predecessor();
    if (j0 < seq) fetch_stats(j0);

    const int k0 = j0 + 16 * warp;
    const int key[2] = {k0 + g, k0 + g + 8};
    float dk[S::DT][4], dv[S::DT][4];
#pragma unroll
    for (int dt = 0; dt < S::DT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            dk[dt][e] = 0.0f;
            dv[dt][e] = 0.0f;
        }
    for (int c0 = j0; c0 < seq; c0 += S::QCHUNK) {
        __syncthreads();
        qn.store(qs);
        dn.store(dos);
        if (threadIdx.x < S::QCHUNK) {
            lse_s[threadIdx.x] = lse_n;
            d_s[threadIdx.x] = d_n;
        }
        __syncthreads();
        if (c0 + S::QCHUNK < seq) {
            fetch_rows(c0 + S::QCHUNK);
            fetch_stats(c0 + S::QCHUNK);
        }
        if (c0 + S::QCHUNK - 1 < k0) continue;  // every query of the chunk is before the warp's keys
        unsigned a[S::KT][4];
        float st[S::QNT][4], dpt[S::QNT][4];
#pragma unroll
        for (int kk = 0; kk < S::KT; ++kk) fl_a<S::LD>(a[kk], kt, 16 * warp, 16 * kk);
        fl_scores<D>(st, a, qs);  // S^T = k q^T
#pragma unroll
        for (int kk = 0; kk < S::KT; ++kk) fl_a<S::LD>(a[kk], vt, 16 * warp, 16 * kk);
        fl_scores<D>(dpt, a, dos);  // dP^T = v dout^T
        const bool edge = c0 < k0 + 15;
#pragma unroll
        for (int n = 0; n < S::QNT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int x = 8 * n + 2 * t + (e & 1);
                float p = tc_exp2(fmaf(st[n][e], c, -lse_s[x]));
                if (edge && c0 + x < key[e >> 1]) p = 0.0f;
                st[n][e] = p;
                dpt[n][e] = p * (dpt[n][e] - d_s[x]);  // dS^T
            }
        fl_store_ds<S::QNT>(dst_h, ds_stride, dpt, key, c0, seq);
        fl_accumulate<D>(dv, st, dos);   // dv += P^T dout
        fl_accumulate<D>(dk, dpt, qs);  // dk += dS^T q
    }
    const bool pairs = FL_WIDE(head_dim % 2 == 0 && aligned8(pk) && aligned8(pv));
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (key[r] >= seq) continue;
        const size_t at = att_q_at(b, key[r], h, seq, heads, head_dim);
#pragma unroll
        for (int dt = 0; dt < S::DT; ++dt) {
            const int col = 8 * dt + 2 * t;
            fl_store_pair(pk + at, col, dk[dt][2 * r], dk[dt][2 * r + 1], head_dim, head_dim, pairs);
            fl_store_pair(pv + at, col, dv[dt][2 * r], dv[dt][2 * r + 1], head_dim, head_dim, pairs);
        }
    }
}

#define ATT_FL_FWD(D)                                                                            \
    extern "C" __global__ void __launch_bounds__(FL_THREADS) attention_flash_fwd_d##D##_bf16(     \
        const unsigned short* __restrict__ q, const unsigned short* __restrict__ k,             \
        const unsigned short* __restrict__ v, float* __restrict__ out, float* __restrict__ lse, \
        unsigned short* __restrict__ out16, int batch, int seq, int heads, int kv_heads,        \
        int head_dim, float scale, long long write_limit) {                                     \
        attention_flash_fwd<D>(q, k, v, out, lse, out16, batch, seq, heads, kv_heads, head_dim, \
                               scale, write_limit);                                             \
    }
#define ATT_FL_DQ(D)                                                                             \
    extern "C" __global__ void __launch_bounds__(FL_THREADS) attention_flash_bwd_dq_d##D##_bf16(  \
        const unsigned short* __restrict__ dst, const unsigned short* __restrict__ k,           \
        float* __restrict__ dq, int batch, int seq, int ds_stride, int heads, int kv_heads,     \
        int head_dim, float scale) {                                                            \
        attention_flash_dq<D>(dst, k, dq, batch, seq, ds_stride, heads, kv_heads, head_dim,     \
                              scale);                                                           \
    }
#define ATT_FL_DKV(D)                                                                            \
    extern "C" __global__ void __launch_bounds__(FL_THREADS) attention_flash_bwd_dkv_d##D##_bf16( \
        const unsigned short* __restrict__ q, const unsigned short* __restrict__ k,             \
        const unsigned short* __restrict__ v, const float* __restrict__ dout,                   \
        const float* __restrict__ lse,                                                          \
        const float* __restrict__ dd, float* __restrict__ pk, float* __restrict__ pv,           \
        unsigned short* __restrict__ dst, int batch, int seq, int ds_stride, int heads,         \
        int kv_heads, int head_dim, float scale) {                                              \
        attention_flash_dkv<D>(q, k, v, dout, lse, dd, pk, pv, dst, batch, seq, ds_stride,      \
                               heads, kv_heads, head_dim, scale);                               \
    }

// The module defines ATT_BUILD (64 or 128) and ATT_PART (kernels/mod.rs):
// one kernel of one build per module, parts 0-2 the f32 kernels, 3-5 the
// tensor-core ones and 6-8 the bf16 flash ones (their aligned build, with
// FL_ALIGNED 1); the f32 and tensor-core dkv modules (parts 2 and 5) also
// hold kv_sum. Part 9 holds the flash backward's row dots and kv_sum, part
// 10 the three flash kernels of the build for any alignment.
#if ATT_BUILD != 64 && ATT_BUILD != 128
#error "ATT_BUILD must be 64 or 128"
#endif
// ATT_BUILD is expanded to its number before the kernel macro pastes it
// into the symbol (a direct ATT_FWD(ATT_BUILD) would paste the name).
#define ATT_INSTANTIATE(KERNEL, D) KERNEL(D)
#if ATT_PART == 0
ATT_INSTANTIATE(ATT_FWD, ATT_BUILD)
#elif ATT_PART == 1
ATT_INSTANTIATE(ATT_DQ, ATT_BUILD)
#elif ATT_PART == 3
ATT_INSTANTIATE(ATT_TC_FWD, ATT_BUILD)
#elif ATT_PART == 4
ATT_INSTANTIATE(ATT_TC_DQ, ATT_BUILD)
#elif ATT_PART == 6
ATT_INSTANTIATE(ATT_FL_FWD, ATT_BUILD)
#elif ATT_PART == 7
ATT_INSTANTIATE(ATT_FL_DQ, ATT_BUILD)
#elif ATT_PART == 8
ATT_INSTANTIATE(ATT_FL_DKV, ATT_BUILD)
#elif ATT_PART == 10
#if FL_ALIGNED
#error "the flash build for any alignment is compiled with FL_ALIGNED 0"
#endif
ATT_INSTANTIATE(ATT_FL_FWD, ATT_BUILD)
ATT_INSTANTIATE(ATT_FL_DQ, ATT_BUILD)
ATT_INSTANTIATE(ATT_FL_DKV, ATT_BUILD)
#elif ATT_PART == 2 || ATT_PART == 5 || ATT_PART == 9
#if ATT_PART == 2
ATT_INSTANTIATE(ATT_DKV, ATT_BUILD)
#elif ATT_PART == 5
ATT_INSTANTIATE(ATT_TC_DKV, ATT_BUILD)
#else

// Backward, part 1 of the flash kernels: D_i = <dout_i, out_i> into dd
// ([batch, heads, seq]), two threads per row, each over half of head_dim,
// in f32: thread `half` sums the products of columns half, half + 2, ... in
// increasing order, then the pair adds its two sums. Grid (ceil(seq / 64),
// heads, batch), 128 threads.
//
// Rows of this build's width (every row 16-byte aligned) are first copied
// into shared memory with cp.async, every piece of the block's rows in
// flight at once (DOTS_ROUND rows at a time: all 64 at head_dim 64, 32 at
// 128), and read from there as float4 packs: both threads of a pair read
// the row's packs (a broadcast) and each takes its two columns of each
// pack. Other rows take the loop below. Both sum the same products in the
// same order.
#define DOTS_LD (ATT_BUILD + 4)  // floats per staged row: four rows a phase, no bank conflicts
#define DOTS_ROUND (64 * 64 / ATT_BUILD)

__device__ __forceinline__ float flash_row_dot_packed(const float* out, const float* dout,
                                                      int half) {
    float acc = 0.0f;
    #pragma unroll
    for (int k = 0; k < ATT_BUILD / 4; ++k) {
        const float4 o = reinterpret_cast<const float4*>(out)[k];
        const float4 d = reinterpret_cast<const float4*>(dout)[k];
        acc = fmaf(half ? d.y : d.x, half ? o.y : o.x, acc);
        acc = fmaf(half ? d.w : d.z, half ? o.w : o.z, acc);
    }
    return acc;
}

// Copies rows i0 + first .. + DOTS_ROUND (those below seq; the rest read
// nothing and become zeros) of out and dout into o_s and d_s and waits
// for them.
__device__ __forceinline__ void flash_dots_stage(float* o_s, float* d_s,
                                                 const float* __restrict__ out,
                                                 const float* __restrict__ dout, int i0,
                                                 int first, int b, int h, int seq, int heads) {
    constexpr int PIECES = ATT_BUILD / 4;  // per row
    static_assert(DOTS_ROUND * PIECES % 128 == 0, "whole pieces per thread");
    #pragma unroll
    for (int u = 0; u < DOTS_ROUND * PIECES / 128; ++u) {
        const int e = threadIdx.x + 128 * u;
        const int n = e / PIECES, c = 4 * (e % PIECES), i = i0 + first + n;
        const size_t at = i < seq ? att_q_at(b, i, h, seq, heads, ATT_BUILD) + c : 0;
        tc_cp16(o_s + n * DOTS_LD + c, out + at, i < seq ? 16 : 0);
        tc_cp16(d_s + n * DOTS_LD + c, dout + at, i < seq ? 16 : 0);
    }
    tc_commit();
    tc_wait_all();
    __syncthreads();
}

extern "C" __global__ void attention_flash_bwd_dots_f32(const float* __restrict__ out,
                                                        const float* __restrict__ dout,
                                                        float* __restrict__ dd, int batch,
                                                        int seq, int heads, int kv_heads,
                                                        int head_dim, float scale) {
    __shared__ __align__(16) float o_s[DOTS_ROUND * DOTS_LD], d_s[DOTS_ROUND * DOTS_LD];
    // Launched as a programmatic dependent: dout is its predecessor's output.
    wait_for_predecessor();
    const int r = threadIdx.x >> 1, half = threadIdx.x & 1;
    const int i0 = 64 * blockIdx.x, i = i0 + r, h = blockIdx.y, b = blockIdx.z;
    float acc = 0.0f;
    if (head_dim == ATT_BUILD && aligned16(out) && aligned16(dout)) {
        for (int first = 0; first < 64; first += DOTS_ROUND) {
            if (first > 0) __syncthreads();  // every thread is done with the last round
            flash_dots_stage(o_s, d_s, out, dout, i0, first, b, h, seq, heads);
            const int n = r - first;
            if (n >= 0 && n < DOTS_ROUND && i < seq)
                acc = flash_row_dot_packed(o_s + n * DOTS_LD, d_s + n * DOTS_LD, half);
        }
    } else if (i < seq) {
        const size_t at = att_q_at(b, i, h, seq, heads, head_dim);
        for (int x = half; x < head_dim; x += 2) acc = fmaf(dout[at + x], out[at + x], acc);
    }
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    if (half == 0 && i < seq) dd[((size_t)b * heads + h) * seq + i] = acc;
}
#endif

// Backward, part 3: dk = scale * (sum over the group's heads of pk) and dv =
// the same sum of pv, heads in increasing order. One thread per element of
// dk, grid-stride.
extern "C" __global__ void attention_bwd_kv_sum_f32(const float* __restrict__ pk,
                                                    const float* __restrict__ pv,
                                                    float* __restrict__ dk,
                                                    float* __restrict__ dv, int batch, int seq,
                                                    int heads, int kv_heads, int head_dim,
                                                    float scale, long long write_limit) {
    const int group = heads / kv_heads;
    const long long n = (long long)batch * seq * kv_heads * head_dim;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
        const int t = (int)(e % head_dim);
        const long long row = e / head_dim;   // (b * seq + j) * kv_heads + g
        const int g = (int)(row % kv_heads);
        const long long bj = row / kv_heads;  // b * seq + j
        const size_t first = ((size_t)bj * heads + (size_t)g * group) * head_dim + t;
        float sk = 0.0f;
        float sv = 0.0f;
        for (int hh = 0; hh < group; ++hh) {
            sk += pk[first + (size_t)hh * head_dim];
            sv += pv[first + (size_t)hh * head_dim];
        }
        dk[e] = scale * sk;
        if (e < write_limit) dv[e] = sv;
    }
    // After the flash dq kernel it runs as that kernel's programmatic
    // dependent, started once the dkv kernel it reads is done (the dq
    // kernel lets it start only then) and overlapping dq's work. It waits for
    // dq at its end, so that its own completion still means every kernel
    // before it on the stream is done. A no-op after an ordinary launch.
    wait_for_predecessor();
}
#else
#error "ATT_PART must be 0 to 10"
#endif  // ATT_PART
