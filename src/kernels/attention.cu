// Causal grouped-query attention (GQA), forward and backward, in f32.
//
// Layouts (row-major, as in reference/attention.rs):
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
// Backward, from the saved P:
//   dP_ij = <dout_i, v_j>,   D_i = sum_j P_ij dP_ij,   dS_ij = P_ij (dP_ij - D_i)
//   dq_i = scale sum_j dS_ij k_j
//   dk_j = scale sum_{h in group} sum_{i >= j} dS_ij q_i
//   dv_j =       sum_{h in group} sum_{i >= j} P_ij dout_i
//
// Kernels: attention_fwd_f32; backward attention_bwd_dq_f32 (dS and dq),
// attention_bwd_dkv_f32 (pk, pv), attention_bwd_kv_sum_f32 (dk, dv).
//
// Tiling. Every tiled kernel runs 256 threads on a tile of ATT_ROWS = 16 rows (query
// rows for the forward and dq, key rows for dk/dv): thread (r, c) with
// r = tid / 16, c = tid % 16 owns row r of the tile. The other dimension is
// walked in chunks staged in shared memory; in a chunk of ATT_CHUNK = 64 keys
// the thread owns keys c, c + 16, c + 32, c + 48, and of a head_dim-wide
// output row it owns columns c, c + 16, ... (head_dim <= ATT_MAX_DIM). Row
// reductions (max, sum) combine the 16 threads of a row, which are one half
// of a warp, with xor shuffles: every thread of the row gets the same value,
// in the same order on every run. Nothing uses atomics, so the results are
// deterministic. Shared-memory rows are padded to an odd length so the
// column-strided reads of a warp hit distinct banks.
//
// `write_limit` exists only so the test-only fault injection "last element
// unwritten" skips real stores; it is the output length otherwise.

#define ATT_ROWS 16
#define ATT_LANES 16
#define ATT_CHUNK 64
#define ATT_KEYS_PER_LANE (ATT_CHUNK / ATT_LANES)
#define ATT_MAX_DIM 128
#define ATT_COLS_PER_LANE (ATT_MAX_DIM / ATT_LANES)
// Query rows per chunk of the dk/dv kernel (two head_dim-wide tiles staged at once).
#define ATT_QCHUNK 32
#define ATT_NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float att_row_max(float v) {
    for (int o = ATT_LANES / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float att_row_sum(float v) {
    for (int o = ATT_LANES / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ size_t att_q_at(int b, int i, int h, int seq, int heads, int head_dim) {
    return (((size_t)b * seq + i) * heads + h) * head_dim;
}

__device__ __forceinline__ size_t att_kv_at(int b, int j, int kvh, int seq, int kv_heads, int head_dim) {
    return (((size_t)b * seq + j) * kv_heads + kvh) * head_dim;
}

__device__ __forceinline__ size_t att_p_at(int b, int h, int i, int seq, int heads) {
    return (((size_t)b * heads + h) * seq + i) * seq;
}

// Stages `rows` rows of `head_dim` floats, row n at src + n * src_stride, into
// dst[n * ld + t]; rows past `valid` are zero. All threads of the block take
// part. Each thread issues its loads four at a time before storing any, so a
// tile costs a few memory latencies rather than one per element; rows that
// are float4-aligned are read as float4.
__device__ __forceinline__ void att_stage(float* dst, int ld, const float* __restrict__ src,
                                          size_t src_stride, int rows, int valid, int head_dim) {
    if ((head_dim & 3) == 0 && (src_stride & 3) == 0 && aligned16(src)) {
        const int per_row = head_dim >> 2;
        const int total = rows * per_row;
        for (int base = threadIdx.x; base < total; base += 4 * blockDim.x) {
            float4 v[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int idx = base + u * blockDim.x;
                const int n = idx / per_row;
                v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (idx < total && n < valid) {
                    v[u] = *reinterpret_cast<const float4*>(src + (size_t)n * src_stride +
                                                            4 * (idx - n * per_row));
                }
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int idx = base + u * blockDim.x;
                if (idx < total) {
                    const int n = idx / per_row;
                    float* d = dst + n * ld + 4 * (idx - n * per_row);
                    d[0] = v[u].x;
                    d[1] = v[u].y;
                    d[2] = v[u].z;
                    d[3] = v[u].w;
                }
            }
        }
        return;
    }
    const int total = rows * head_dim;
    for (int base = threadIdx.x; base < total; base += 4 * blockDim.x) {
        float v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int idx = base + u * blockDim.x;
            const int n = idx / head_dim;
            v[u] = (idx < total && n < valid) ? src[(size_t)n * src_stride + (idx - n * head_dim)]
                                              : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int idx = base + u * blockDim.x;
            if (idx < total) {
                const int n = idx / head_dim;
                dst[n * ld + (idx - n * head_dim)] = v[u];
            }
        }
    }
}

// out[n] = <a[0..head_dim), b_n[0..head_dim)> for the four shared-memory rows
// b_n = b + (n * ATT_LANES) * ld: four independent accumulation chains.
__device__ __forceinline__ void att_dot4(const float* a, const float* b, int ld, int head_dim,
                                         float out[ATT_KEYS_PER_LANE]) {
#pragma unroll
    for (int n = 0; n < ATT_KEYS_PER_LANE; ++n) out[n] = 0.0f;
    for (int t = 0; t < head_dim; ++t) {
        const float av = a[t];
#pragma unroll
        for (int n = 0; n < ATT_KEYS_PER_LANE; ++n) {
            out[n] = fmaf(av, b[(n * ATT_LANES) * ld + t], out[n]);
        }
    }
}

// Forward: out[b, i, h, :] and probs[b, h, i, :]. Grid (ceil(seq / 16), heads,
// batch), 256 threads, dynamic shared memory
// (ATT_ROWS + ATT_CHUNK) * (head_dim + 1) + ATT_ROWS * (ATT_CHUNK + 1) floats.
//
// Pass 1 computes the scaled scores chunk by chunk, stores them in probs and
// keeps the running row maximum m and sum l (l rescaled by exp(m_old - m_new)
// when m grows). Pass 2 reads each thread's own scores back, turns them into
// probabilities, stores them, and accumulates P V from shared memory. The
// entries right of the last chunk are zeroed.
extern "C" __global__ void __launch_bounds__(256)
attention_fwd_f32(const float* __restrict__ q, const float* __restrict__ k,
                  const float* __restrict__ v, float* __restrict__ out,
                  float* __restrict__ probs, int batch, int seq, int heads,
                  int kv_heads, int head_dim, float scale, long long write_limit) {
    extern __shared__ float att_smem[];
    const int ld = head_dim + 1;
    float* qs = att_smem;                      // [ATT_ROWS][ld]
    float* kvs = qs + ATT_ROWS * ld;           // [ATT_CHUNK][ld]: k, then v
    float* ps = kvs + ATT_CHUNK * ld;          // [ATT_ROWS][ATT_CHUNK + 1]

    const int r0 = blockIdx.x * ATT_ROWS;
    const int h = blockIdx.y;
    const int b = blockIdx.z;
    if (r0 >= seq || h >= heads || b >= batch) return;  // whole block
    const int kvh = h / (heads / kv_heads);
    const int r = threadIdx.x / ATT_LANES;
    const int c = threadIdx.x % ATT_LANES;
    const int i = r0 + r;
    const bool row_ok = i < seq;
    const int tile_rows = min(ATT_ROWS, seq - r0);
    // Keys 0 ..= last row of the tile; every chunk starts at or before r0, so
    // key j0 of a chunk is visible to every row and each chunk maximum is finite.
    const int key_end = min(seq, r0 + ATT_ROWS);
    const size_t kv_stride = (size_t)kv_heads * head_dim;
    const size_t p_row = att_p_at(b, h, row_ok ? i : 0, seq, heads);

    att_stage(qs, ld, q + att_q_at(b, r0, h, seq, heads, head_dim), (size_t)heads * head_dim,
              ATT_ROWS, tile_rows, head_dim);

    float m = ATT_NEG_INF;
    float l = 0.0f;
    for (int j0 = 0; j0 < key_end; j0 += ATT_CHUNK) {
        __syncthreads();  // qs staged; the previous chunk's kvs no longer read
        att_stage(kvs, ld, k + att_kv_at(b, j0, kvh, seq, kv_heads, head_dim), kv_stride,
                  ATT_CHUNK, min(ATT_CHUNK, seq - j0), head_dim);
        __syncthreads();
        float s[ATT_KEYS_PER_LANE];
        att_dot4(qs + r * ld, kvs + c * ld, ld, head_dim, s);
        float chunk_max = ATT_NEG_INF;
#pragma unroll
        for (int n = 0; n < ATT_KEYS_PER_LANE; ++n) {
            const int j = j0 + c + n * ATT_LANES;
            float sv = ATT_NEG_INF;
            if (j < seq && (j <= i || !row_ok)) {
                sv = scale * s[n];
                if (row_ok) probs[p_row + j] = sv;
            }
            s[n] = sv;
            chunk_max = fmaxf(chunk_max, sv);
        }
        chunk_max = att_row_max(chunk_max);
        const float m_new = fmaxf(m, chunk_max);
        float part = 0.0f;
#pragma unroll
        for (int n = 0; n < ATT_KEYS_PER_LANE; ++n) part += expf(s[n] - m_new);
        l = l * expf(m - m_new) + att_row_sum(part);
        m = m_new;
    }
    const float inv_l = 1.0f / l;

    float acc[ATT_COLS_PER_LANE];
#pragma unroll
    for (int n = 0; n < ATT_COLS_PER_LANE; ++n) acc[n] = 0.0f;
    for (int j0 = 0; j0 < key_end; j0 += ATT_CHUNK) {
        __syncthreads();  // the previous chunk's kvs and ps no longer read
        att_stage(kvs, ld, v + att_kv_at(b, j0, kvh, seq, kv_heads, head_dim), kv_stride,
                  ATT_CHUNK, min(ATT_CHUNK, seq - j0), head_dim);
#pragma unroll
        for (int n = 0; n < ATT_KEYS_PER_LANE; ++n) {
            const int jj = c + n * ATT_LANES;
            const int j = j0 + jj;
            float p = 0.0f;
            if (row_ok && j < seq) {
                // This thread stored probs[p_row + j] in pass 1 when j <= i.
                if (j <= i) p = expf(probs[p_row + j] - m) * inv_l;
                probs[p_row + j] = p;
            }
            ps[r * (ATT_CHUNK + 1) + jj] = p;
        }
        __syncthreads();
        const int chunk = min(ATT_CHUNK, seq - j0);
        for (int jj = 0; jj < chunk; ++jj) {
            const float p = ps[r * (ATT_CHUNK + 1) + jj];
            const float* vj = kvs + jj * ld;
#pragma unroll
            for (int n = 0; n < ATT_COLS_PER_LANE; ++n) {
                const int t = c + n * ATT_LANES;
                if (t < head_dim) acc[n] = fmaf(p, vj[t], acc[n]);
            }
        }
    }
    if (!row_ok) return;
    const int zero_from = ((key_end + ATT_CHUNK - 1) / ATT_CHUNK) * ATT_CHUNK;
    for (int j = zero_from + c; j < seq; j += ATT_LANES) probs[p_row + j] = 0.0f;
    const size_t o_row = att_q_at(b, i, h, seq, heads, head_dim);
#pragma unroll
    for (int n = 0; n < ATT_COLS_PER_LANE; ++n) {
        const int t = c + n * ATT_LANES;
        const size_t idx = o_row + t;
        if (t < head_dim && (long long)idx < write_limit) out[idx] = acc[n];
    }
}

// Backward, part 1: dS into ds (j <= i; the rest of a row is not written
// beyond its last chunk) and dq. Grid (ceil(seq / 16), heads, batch), 256
// threads, the forward's dynamic shared memory.
//
// Pass 1 computes dP chunk by chunk, stores it in ds and sums P dP into D_i.
// Pass 2 reads each thread's own dP back, stores dS = P (dP - D_i) and
// accumulates dS K from shared memory.
extern "C" __global__ void __launch_bounds__(256)
attention_bwd_dq_f32(const float* __restrict__ k, const float* __restrict__ v,
                     const float* __restrict__ probs, const float* __restrict__ dout,
                     float* __restrict__ dq, float* __restrict__ ds, int batch, int seq,
                     int heads, int kv_heads, int head_dim, float scale) {
    extern __shared__ float att_smem[];
    const int ld = head_dim + 1;
    float* dos = att_smem;                     // [ATT_ROWS][ld]: dout rows
    float* kvs = dos + ATT_ROWS * ld;          // [ATT_CHUNK][ld]: v, then k
    float* ss = kvs + ATT_CHUNK * ld;          // [ATT_ROWS][ATT_CHUNK + 1]: dS

    const int r0 = blockIdx.x * ATT_ROWS;
    const int h = blockIdx.y;
    const int b = blockIdx.z;
    if (r0 >= seq || h >= heads || b >= batch) return;
    const int kvh = h / (heads / kv_heads);
    const int r = threadIdx.x / ATT_LANES;
    const int c = threadIdx.x % ATT_LANES;
    const int i = r0 + r;
    const bool row_ok = i < seq;
    const int tile_rows = min(ATT_ROWS, seq - r0);
    const int key_end = min(seq, r0 + ATT_ROWS);
    const size_t kv_stride = (size_t)kv_heads * head_dim;
    const size_t p_row = att_p_at(b, h, row_ok ? i : 0, seq, heads);

    att_stage(dos, ld, dout + att_q_at(b, r0, h, seq, heads, head_dim),
              (size_t)heads * head_dim, ATT_ROWS, tile_rows, head_dim);

    float d_part = 0.0f;
    for (int j0 = 0; j0 < key_end; j0 += ATT_CHUNK) {
        __syncthreads();
        att_stage(kvs, ld, v + att_kv_at(b, j0, kvh, seq, kv_heads, head_dim), kv_stride,
                  ATT_CHUNK, min(ATT_CHUNK, seq - j0), head_dim);
        __syncthreads();
        float dp[ATT_KEYS_PER_LANE];
        att_dot4(dos + r * ld, kvs + c * ld, ld, head_dim, dp);
#pragma unroll
        for (int n = 0; n < ATT_KEYS_PER_LANE; ++n) {
            const int j = j0 + c + n * ATT_LANES;
            if (row_ok && j <= i) {
                ds[p_row + j] = dp[n];
                d_part = fmaf(probs[p_row + j], dp[n], d_part);
            }
        }
    }
    const float d_i = att_row_sum(d_part);

    float acc[ATT_COLS_PER_LANE];
#pragma unroll
    for (int n = 0; n < ATT_COLS_PER_LANE; ++n) acc[n] = 0.0f;
    for (int j0 = 0; j0 < key_end; j0 += ATT_CHUNK) {
        __syncthreads();
        att_stage(kvs, ld, k + att_kv_at(b, j0, kvh, seq, kv_heads, head_dim), kv_stride,
                  ATT_CHUNK, min(ATT_CHUNK, seq - j0), head_dim);
#pragma unroll
        for (int n = 0; n < ATT_KEYS_PER_LANE; ++n) {
            const int jj = c + n * ATT_LANES;
            const int j = j0 + jj;
            float g = 0.0f;
            if (row_ok && j < seq) {
                // This thread stored ds[p_row + j] = dP in pass 1 when j <= i.
                if (j <= i) g = probs[p_row + j] * (ds[p_row + j] - d_i);
                ds[p_row + j] = g;
            }
            ss[r * (ATT_CHUNK + 1) + jj] = g;
        }
        __syncthreads();
        const int chunk = min(ATT_CHUNK, seq - j0);
        for (int jj = 0; jj < chunk; ++jj) {
            const float g = ss[r * (ATT_CHUNK + 1) + jj];
            const float* kj = kvs + jj * ld;
#pragma unroll
            for (int n = 0; n < ATT_COLS_PER_LANE; ++n) {
                const int t = c + n * ATT_LANES;
                if (t < head_dim) acc[n] = fmaf(g, kj[t], acc[n]);
            }
        }
    }
    if (!row_ok) return;
    const size_t o_row = att_q_at(b, i, h, seq, heads, head_dim);
#pragma unroll
    for (int n = 0; n < ATT_COLS_PER_LANE; ++n) {
        const int t = c + n * ATT_LANES;
        if (t < head_dim) dq[o_row + t] = scale * acc[n];
    }
}

// Backward, part 2: one query head's share of dk and dv for a tile of 16
// key rows j, summed over the query rows i >= j, staged ATT_QCHUNK rows at a
// time (q and dout rows, and the matching dS and P columns, masked to
// i >= j), written to pk, pv in the layout of q:
//   pk[b, j, h, :] = sum_{i >= j} dS_ij q_i,   pv[b, j, h, :] = sum_{i >= j} P_ij dout_i.
// One block per (key tile, query head, batch) rather than per kv head keeps
// every SM busy; part 3 sums the group's heads in a fixed order. Grid
// (ceil(seq / 16), heads, batch), 256 threads, dynamic shared memory
// 2 * ATT_QCHUNK * (head_dim + 1) + 2 * ATT_ROWS * (ATT_QCHUNK + 1) floats.
extern "C" __global__ void __launch_bounds__(256)
attention_bwd_dkv_f32(const float* __restrict__ q, const float* __restrict__ dout,
                      const float* __restrict__ probs, const float* __restrict__ ds,
                      float* __restrict__ pk, float* __restrict__ pv, int batch, int seq,
                      int heads, int head_dim) {
    extern __shared__ float att_smem[];
    const int ld = head_dim + 1;
    const int lt = ATT_QCHUNK + 1;
    float* qs = att_smem;                      // [ATT_QCHUNK][ld]: q rows
    float* dos = qs + ATT_QCHUNK * ld;         // [ATT_QCHUNK][ld]: dout rows
    float* sts = dos + ATT_QCHUNK * ld;        // [ATT_ROWS][lt]: dS^T
    float* pts = sts + ATT_ROWS * lt;          // [ATT_ROWS][lt]: P^T

    const int j0 = blockIdx.x * ATT_ROWS;
    const int h = blockIdx.y;
    const int b = blockIdx.z;
    if (j0 >= seq || h >= heads || b >= batch) return;
    const int r = threadIdx.x / ATT_LANES;
    const int c = threadIdx.x % ATT_LANES;
    const int j = j0 + r;
    const size_t q_stride = (size_t)heads * head_dim;

    float k_acc[ATT_COLS_PER_LANE];
    float v_acc[ATT_COLS_PER_LANE];
#pragma unroll
    for (int n = 0; n < ATT_COLS_PER_LANE; ++n) {
        k_acc[n] = 0.0f;
        v_acc[n] = 0.0f;
    }
    for (int i0 = j0; i0 < seq; i0 += ATT_QCHUNK) {
        const int rows = min(ATT_QCHUNK, seq - i0);
        __syncthreads();  // the previous chunk is no longer read
        att_stage(qs, ld, q + att_q_at(b, i0, h, seq, heads, head_dim), q_stride, ATT_QCHUNK,
                  rows, head_dim);
        att_stage(dos, ld, dout + att_q_at(b, i0, h, seq, heads, head_dim), q_stride,
                  ATT_QCHUNK, rows, head_dim);
        // Columns j0..j0+15 of rows i0..i0+31: 16 consecutive floats per row.
#pragma unroll
        for (int u = 0; u < (ATT_QCHUNK * ATT_ROWS) / 256; ++u) {
            const int idx = threadIdx.x + u * 256;
            const int ii = idx / ATT_ROWS;
            const int rr = idx - ii * ATT_ROWS;
            const int ir = i0 + ii;
            const int jr = j0 + rr;
            float s_val = 0.0f;
            float p_val = 0.0f;
            if (ir < seq && jr < seq && ir >= jr) {
                const size_t at = att_p_at(b, h, ir, seq, heads) + jr;
                s_val = ds[at];
                p_val = probs[at];
            }
            sts[rr * lt + ii] = s_val;
            pts[rr * lt + ii] = p_val;
        }
        __syncthreads();
        for (int ii = 0; ii < rows; ++ii) {
            const float s_val = sts[r * lt + ii];
            const float p_val = pts[r * lt + ii];
            const float* qi = qs + ii * ld;
            const float* doi = dos + ii * ld;
#pragma unroll
            for (int n = 0; n < ATT_COLS_PER_LANE; ++n) {
                const int t = c + n * ATT_LANES;
                if (t < head_dim) {
                    k_acc[n] = fmaf(s_val, qi[t], k_acc[n]);
                    v_acc[n] = fmaf(p_val, doi[t], v_acc[n]);
                }
            }
        }
    }
    if (j >= seq) return;
    const size_t o_row = att_q_at(b, j, h, seq, heads, head_dim);
#pragma unroll
    for (int n = 0; n < ATT_COLS_PER_LANE; ++n) {
        const int t = c + n * ATT_LANES;
        if (t < head_dim) {
            pk[o_row + t] = k_acc[n];
            pv[o_row + t] = v_acc[n];
        }
    }
}

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
