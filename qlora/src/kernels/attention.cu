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

// One kernel per macro, so each module (below) holds one of them.
#define ATT_FWD(D)                                                                             \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS) attention_fwd_d##D##_f32(       \
        const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v, \
        float* __restrict__ out, float* __restrict__ probs, int batch, int seq, int heads,    \
        int kv_heads, int head_dim, float scale, long long write_limit) {                     \
        attention_fwd<D>(q, k, v, out, probs, batch, seq, heads, kv_heads, head_dim, scale,  \
                         write_limit);                                                        \
    }
#define ATT_DQ(D)                                                                              \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS) attention_bwd_dq_d##D##_f32(    \
        const float* __restrict__ k, const float* __restrict__ v,                             \
        const float* __restrict__ probs, const float* __restrict__ out,                       \
        const float* __restrict__ dout, float* __restrict__ dq, float* __restrict__ ds,       \
        int batch, int seq, int heads, int kv_heads, int head_dim, float scale) {             \
        attention_bwd_dq<D>(k, v, probs, out, dout, dq, ds, batch, seq, heads, kv_heads,      \
                            head_dim, scale);                                                 \
    }
#define ATT_DKV(D)                                                                             \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS) attention_bwd_dkv_d##D##_f32(   \
        const float* __restrict__ q, const float* __restrict__ dout,                          \
        const float* __restrict__ probs, const float* __restrict__ ds, float* __restrict__ pk, \
        float* __restrict__ pv, int batch, int seq, int heads, int head_dim) {                \
        attention_bwd_dkv<D>(q, dout, probs, ds, pk, pv, batch, seq, heads, head_dim);        \
    }

// The module defines ATT_BUILD (64 or 128) and ATT_PART (kernels/mod.rs):
// one kernel of one build per module; the dkv module also holds kv_sum.
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
#elif ATT_PART == 2
ATT_INSTANTIATE(ATT_DKV, ATT_BUILD)

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
}
#else
#error "ATT_PART must be 0, 1 or 2"
#endif  // ATT_PART
