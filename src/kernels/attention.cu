// Causal grouped-query attention (GQA), forward and backward, in f32.
//
// Layouts (row-major, as in reference/attention.rs):
//   q, out, dq, dout  [batch, seq, heads, head_dim]
//   k, v, dk, dv      [batch, seq, kv_heads, head_dim]
//   probs, ds         [batch, heads, seq, seq], masked entries (j > i) exactly 0
// Query head h reads kv head h / (heads / kv_heads).
//
//   S_ij = scale <q_i, k_j>,  scale = 1 / sqrt(head_dim) (passed in)
//   P_ij = exp(S_ij - max_j S_ij) / sum_j exp(S_ij - max_j S_ij)   for j <= i
//   out_i = sum_{j <= i} P_ij v_j
//
// Backward, from the saved P:
//   dP_ij = <dout_i, v_j>,   D_i = sum_j P_ij dP_ij,   dS_ij = P_ij (dP_ij - D_i)
//   dq_i = scale sum_j dS_ij k_j
//   dk_j = scale sum_{h in group} sum_{i >= j} dS_ij q_i
//   dv_j =       sum_{h in group} sum_{i >= j} P_ij dout_i
//
// Everything is deterministic: no atomics. dk and dv are gathered by one
// thread per (b, kv head, j, t) that walks the group's heads and the rows
// i >= j in a fixed order.
//
// The row kernels (forward, dq) use one block per (query row i, head h,
// batch b): grid (seq, heads, batch), blockDim a multiple of 32 (128), and
// (head_dim + seq) floats of dynamic shared memory.
//
// `write_limit` exists only so the test-only fault injection "last element
// unwritten" skips real stores; it is the output length otherwise.

#define ATTN_NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float attn_warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    }
    return v;
}

__device__ __forceinline__ float attn_warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    return v;
}

// Maximum of v over the block; every thread gets it. blockDim.x must be a
// multiple of 32 and at most 1024. Ends with a barrier so `red` can be reused.
__device__ float attn_block_max(float v, float* red) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int n_warps = blockDim.x >> 5;
    v = attn_warp_max(v);
    if (lane == 0) {
        red[warp] = v;
    }
    __syncthreads();
    float r = (lane < n_warps) ? red[lane] : ATTN_NEG_INF;
    r = attn_warp_max(r);
    __syncthreads();
    return r;
}

// Sum of v over the block (fixed order, so deterministic); every thread gets
// it. Same requirements as attn_block_max.
__device__ float attn_block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int n_warps = blockDim.x >> 5;
    v = attn_warp_sum(v);
    if (lane == 0) {
        red[warp] = v;
    }
    __syncthreads();
    float r = (lane < n_warps) ? red[lane] : 0.0f;
    r = attn_warp_sum(r);
    __syncthreads();
    return r;
}

__device__ __forceinline__ size_t attn_q_at(int b, int i, int h, int seq, int heads, int head_dim) {
    return (((size_t)b * seq + i) * heads + h) * head_dim;
}

__device__ __forceinline__ size_t attn_kv_at(int b, int j, int kvh, int seq, int kv_heads, int head_dim) {
    return (((size_t)b * seq + j) * kv_heads + kvh) * head_dim;
}

__device__ __forceinline__ size_t attn_p_at(int b, int h, int i, int seq, int heads) {
    return (((size_t)b * heads + h) * seq + i) * seq;
}

// Forward: out[b, i, h, :] and probs[b, h, i, :]. Grid (seq, heads, batch).
extern "C" __global__ void attention_fwd_f32(const float* __restrict__ q,
                                             const float* __restrict__ k,
                                             const float* __restrict__ v,
                                             float* __restrict__ out,
                                             float* __restrict__ probs,
                                             int batch, int seq, int heads,
                                             int kv_heads, int head_dim,
                                             float scale,
                                             long long write_limit) {
    extern __shared__ float attn_smem[];
    __shared__ float red[32];
    float* qs = attn_smem;             // [head_dim]: q_i
    float* ps = attn_smem + head_dim;  // [seq]: scores, then probabilities

    const int i = blockIdx.x;
    const int h = blockIdx.y;
    const int b = blockIdx.z;
    if (i >= seq || h >= heads || b >= batch) {
        return;  // whole block: no barrier is skipped by part of it
    }
    const int kvh = h / (heads / kv_heads);
    const size_t q_off = attn_q_at(b, i, h, seq, heads, head_dim);

    for (int t = threadIdx.x; t < head_dim; t += blockDim.x) {
        qs[t] = q[q_off + t];
    }
    __syncthreads();

    // Scores of the visible prefix j <= i, and their maximum.
    float local_max = ATTN_NEG_INF;
    for (int j = threadIdx.x; j <= i; j += blockDim.x) {
        const float* kj = k + attn_kv_at(b, j, kvh, seq, kv_heads, head_dim);
        float s = 0.0f;
        for (int t = 0; t < head_dim; ++t) {
            s = fmaf(qs[t], kj[t], s);
        }
        s *= scale;
        ps[j] = s;
        local_max = fmaxf(local_max, s);
    }
    const float row_max = attn_block_max(local_max, red);

    // Each thread revisits the same j as above, so ps[j] is its own write.
    float local_sum = 0.0f;
    for (int j = threadIdx.x; j <= i; j += blockDim.x) {
        const float e = expf(ps[j] - row_max);
        ps[j] = e;
        local_sum += e;
    }
    const float inv_sum = 1.0f / attn_block_sum(local_sum, red);

    const size_t p_off = attn_p_at(b, h, i, seq, heads);
    for (int j = threadIdx.x; j < seq; j += blockDim.x) {
        float p = 0.0f;
        if (j <= i) {
            p = ps[j] * inv_sum;
            ps[j] = p;
        }
        probs[p_off + j] = p;
    }
    __syncthreads();

    for (int t = threadIdx.x; t < head_dim; t += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j <= i; ++j) {
            acc = fmaf(ps[j], v[attn_kv_at(b, j, kvh, seq, kv_heads, head_dim) + t], acc);
        }
        const size_t idx = q_off + t;
        if ((long long)idx < write_limit) {
            out[idx] = acc;
        }
    }
}

// Backward, part 1: dS (into ds, full rows with zeros above the diagonal) and
// dq. Grid (seq, heads, batch), blockDim a multiple of 32.
extern "C" __global__ void attention_bwd_dq_f32(const float* __restrict__ k,
                                                const float* __restrict__ v,
                                                const float* __restrict__ probs,
                                                const float* __restrict__ dout,
                                                float* __restrict__ dq,
                                                float* __restrict__ ds,
                                                int batch, int seq, int heads,
                                                int kv_heads, int head_dim,
                                                float scale) {
    extern __shared__ float attn_smem[];
    __shared__ float red[32];
    float* dos = attn_smem;              // [head_dim]: dout_i
    float* dps = attn_smem + head_dim;   // [seq]: dP_ij, then dS_ij

    const int i = blockIdx.x;
    const int h = blockIdx.y;
    const int b = blockIdx.z;
    if (i >= seq || h >= heads || b >= batch) {
        return;
    }
    const int kvh = h / (heads / kv_heads);
    const size_t q_off = attn_q_at(b, i, h, seq, heads, head_dim);
    const size_t p_off = attn_p_at(b, h, i, seq, heads);

    for (int t = threadIdx.x; t < head_dim; t += blockDim.x) {
        dos[t] = dout[q_off + t];
    }
    __syncthreads();

    float local = 0.0f;
    for (int j = threadIdx.x; j <= i; j += blockDim.x) {
        const float* vj = v + attn_kv_at(b, j, kvh, seq, kv_heads, head_dim);
        float dp = 0.0f;
        for (int t = 0; t < head_dim; ++t) {
            dp = fmaf(dos[t], vj[t], dp);
        }
        dps[j] = dp;
        local = fmaf(probs[p_off + j], dp, local);
    }
    const float d_i = attn_block_sum(local, red);

    for (int j = threadIdx.x; j < seq; j += blockDim.x) {
        float g = 0.0f;
        if (j <= i) {
            g = probs[p_off + j] * (dps[j] - d_i);
            dps[j] = g;
        }
        ds[p_off + j] = g;
    }
    __syncthreads();

    for (int t = threadIdx.x; t < head_dim; t += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j <= i; ++j) {
            acc = fmaf(dps[j], k[attn_kv_at(b, j, kvh, seq, kv_heads, head_dim) + t], acc);
        }
        dq[q_off + t] = scale * acc;
    }
}

// Backward, part 2: dk and dv, one block per (key row j, kv head g, batch b),
// one thread per t < head_dim (grid-stride over t). Grid (seq, kv_heads,
// batch); any blockDim.
extern "C" __global__ void attention_bwd_dkv_f32(const float* __restrict__ q,
                                                 const float* __restrict__ dout,
                                                 const float* __restrict__ probs,
                                                 const float* __restrict__ ds,
                                                 float* __restrict__ dk,
                                                 float* __restrict__ dv,
                                                 int batch, int seq, int heads,
                                                 int kv_heads, int head_dim,
                                                 float scale,
                                                 long long write_limit) {
    const int j = blockIdx.x;
    const int g = blockIdx.y;
    const int b = blockIdx.z;
    if (j >= seq || g >= kv_heads || b >= batch) {
        return;
    }
    const int group = heads / kv_heads;
    const size_t kv_off = attn_kv_at(b, j, g, seq, kv_heads, head_dim);

    for (int t = threadIdx.x; t < head_dim; t += blockDim.x) {
        float dk_acc = 0.0f;
        float dv_acc = 0.0f;
        for (int hh = 0; hh < group; ++hh) {
            const int h = g * group + hh;
            for (int i = j; i < seq; ++i) {
                const size_t pidx = attn_p_at(b, h, i, seq, heads) + j;
                const size_t qidx = attn_q_at(b, i, h, seq, heads, head_dim) + t;
                dk_acc = fmaf(ds[pidx], q[qidx], dk_acc);
                dv_acc = fmaf(probs[pidx], dout[qidx], dv_acc);
            }
        }
        dk[kv_off + t] = scale * dk_acc;
        const size_t idx = kv_off + t;
        if ((long long)idx < write_limit) {
            dv[idx] = dv_acc;
        }
    }
}
