// Embedding gather, table [vocab, hidden] row-major, tokens [ntok]:
//
//   forward:  y[t, i] = table[tokens[t], i]   (an f32 or a bf16 table)
//   backward: dtable[v, i] = sum_{t : tokens[t] == v} dy[t, i]   (t ascending)
//
// A token outside [0, vocab) makes its output row NaN (detectable, never a
// read out of bounds); in backward such a token contributes to no row.
//
// Both kernels: one block per output row (grid.x = rows to write), threads
// stride over hidden, so loads and stores are coalesced. The backward is
// deterministic: each table row is owned by one block that scans the tokens
// in order and sums the matching dy rows; no atomics.
//
// Two modules (EMB_PART): 0 `embedding`, the forward, which the training
// step runs (its embedding table is frozen), and 1 `embedding_bwd`.

#if EMB_PART == 0
// An f32 table's element as it is; a bf16 table's (raw bits) widened, exactly.
__device__ __forceinline__ float table_value(float v) { return v; }
__device__ __forceinline__ float table_value(unsigned short h) { return bf16_bits_to_f32(h); }

template <typename T>
__device__ __forceinline__ void gather(const T* __restrict__ table,
                                       const unsigned int* __restrict__ tokens,
                                       float* __restrict__ y, int ntok, int vocab, int hidden) {
    const int t = blockIdx.x;
    if (t >= ntok) return;
    const unsigned int tok = tokens[t];
    float* yr = y + (size_t)t * hidden;
    if (tok >= (unsigned int)vocab) {
        for (int i = threadIdx.x; i < hidden; i += blockDim.x) yr[i] = __int_as_float(0x7fc00000);
        return;
    }
    const T* src = table + (size_t)tok * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) yr[i] = table_value(src[i]);
}

extern "C" __global__ void embedding_fwd_f32(const float* __restrict__ table,
                                             const unsigned int* __restrict__ tokens,
                                             float* __restrict__ y,
                                             int ntok, int vocab, int hidden) {
    gather(table, tokens, y, ntok, vocab, hidden);
}

// As embedding_fwd_f32 from a bf16 table (raw bits): y[t, i] = f32(table[tokens[t], i]), exact.
extern "C" __global__ void embedding_fwd_bf16(const unsigned short* __restrict__ table,
                                              const unsigned int* __restrict__ tokens,
                                              float* __restrict__ y,
                                              int ntok, int vocab, int hidden) {
    gather(table, tokens, y, ntok, vocab, hidden);
}
#endif

#if EMB_PART == 1
// dtable rows [0, vocab_rows); every one of them is written (zero when no
// token matches). blockDim.x a multiple of 32, at most 1024.
//
// Block v walks the tokens in tiles of blockDim.x. In each tile it compacts the
// positions t with tokens[t] == v into shared memory in ascending order (warp
// ballot + a serial prefix over the warps), then each thread adds those dy rows
// to its own columns of dtable[v]. Tiles ascend, positions ascend within a
// tile, so every sum runs in t order: deterministic. Scan cost vocab * ntok / 32
// warp compares.
extern "C" __global__ void embedding_bwd_f32(const float* __restrict__ dy,
                                             const unsigned int* __restrict__ tokens,
                                             float* __restrict__ dtable,
                                             int ntok, int vocab_rows, int hidden) {
    __shared__ int match[1024];
    __shared__ int warp_offset[32];
    __shared__ int nmatch;
    const int v = blockIdx.x;
    if (v >= vocab_rows) return;  // uniform per block
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    float* dr = dtable + (size_t)v * hidden;
    for (int i = tid; i < hidden; i += blockDim.x) dr[i] = 0.0f;
    for (int tile = 0; tile < ntok; tile += blockDim.x) {
        const int t = tile + tid;
        const bool hit = t < ntok && tokens[t] == (unsigned int)v;
        const unsigned int ballot = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) warp_offset[warp] = __popc(ballot);
        __syncthreads();
        if (tid == 0) {
            int sum = 0;
            for (int w = 0; w < nwarps; ++w) {
                const int c = warp_offset[w];
                warp_offset[w] = sum;
                sum += c;
            }
            nmatch = sum;
        }
        __syncthreads();
        if (hit) match[warp_offset[warp] + __popc(ballot & ((1u << lane) - 1u))] = t;
        __syncthreads();
        const int n = nmatch;
        if (n > 0) {
            // Each thread owns its columns of dr: no race between threads.
            for (int i = tid; i < hidden; i += blockDim.x) {
                float acc = dr[i];
                for (int k = 0; k < n; ++k) acc += dy[(size_t)match[k] * hidden + i];
                dr[i] = acc;
            }
        }
        __syncthreads();  // match, warp_offset and nmatch are rewritten by the next tile
    }
}
#endif
