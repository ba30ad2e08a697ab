"""PyTorch's attention kernels at one qwen2.5-0.5b layer's shape, forward and
forward + backward, CUDA-graph timed: the reference for K-EFF-ATTN-001's
5x aim (the f32 kernels take 70 + 129 us a layer on an H100).

batch 4, seq 256, 14 query heads, 2 kv heads, head_dim 64, causal.
Each backend is timed as a graph of R calls replayed; the figure is the
median over 20 replays of (replay time / R). GQA: enable_gqa=True where
the backend takes it, else k and v are expanded to 14 heads inside the
timed region (repeat_interleave, its backward sums the group).
"""
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

B, S, H, KV, D = 4, 256, 14, 2, 64
R = 20


def make(dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, S, D, device="cuda", dtype=dtype, generator=g).requires_grad_()
    k = torch.randn(B, KV, S, D, device="cuda", dtype=dtype, generator=g).requires_grad_()
    v = torch.randn(B, KV, S, D, device="cuda", dtype=dtype, generator=g).requires_grad_()
    do = torch.randn(B, H, S, D, device="cuda", dtype=dtype, generator=g)
    return q, k, v, do


def attn(q, k, v, gqa_native):
    if gqa_native:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    k2 = k.repeat_interleave(H // KV, dim=1)
    v2 = v.repeat_interleave(H // KV, dim=1)
    return F.scaled_dot_product_attention(q, k2, v2, is_causal=True)


def timed(fn):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    s = SIDE
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(R):
            fn()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / R)
    return statistics.median(times)


def run(name, backend, dtype, tf32):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    q, k, v, do = make(dtype)
    for gqa_native in (True, False):
        try:
            with sdpa_kernel([backend]):
                def fwd():
                    with torch.no_grad():
                        attn(q, k, v, gqa_native)

                def fwd_bwd():
                    out = attn(q, k, v, gqa_native)
                    torch.autograd.grad(out, (q, k, v), do)

                # correctness against the math backend in f64
                out = attn(q, k, v, gqa_native)
                gq, gk, gv = torch.autograd.grad(out, (q, k, v), do)
                tf = timed(fwd)
                tb = timed(fwd_bwd)
        except Exception as e:  # a backend that refuses this dtype or shape
            print(f"{name:<34} gqa_native={gqa_native}: refused ({str(e).splitlines()[0][:90]})")
            continue
        with sdpa_kernel([SDPBackend.MATH]):
            q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
            o64 = attn(q64, k64, v64, True)
            r = torch.autograd.grad(o64, (q64, k64, v64), do.double())
        rel = lambda x, y: ((x.double() - y).norm() / y.norm()).item()
        print(f"{name:<34} gqa_native={gqa_native}: fwd {tf:6.1f} us, fwd+bwd {tb:6.1f} us; "
              f"rel L2 out {rel(out, o64):.1e} dq {rel(gq, r[0]):.1e} dk {rel(gk, r[1]):.1e} dv {rel(gv, r[2]):.1e}")
        break


# cuBLAS makes its handle and workspace on first use per stream; outside a
# capture, so the first graph does not fail on it.
SIDE = torch.cuda.Stream()
for stream in (torch.cuda.current_stream(), SIDE):
    with torch.cuda.stream(stream):
        x = torch.randn(64, 64, device="cuda", requires_grad=True)
        (x @ x).sum().backward()
torch.cuda.synchronize()
print(torch.__version__, torch.cuda.get_device_name(), file=sys.stderr)
print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuda {torch.version.cuda}, "
      f"cudnn {torch.backends.cudnn.version()}")
print(f"shape: batch {B}, seq {S}, heads {H}/{KV}, head_dim {D}, causal; graph of {R} calls, median of 20 replays")
for name, backend, dtype, tf32 in [
    ("math, f32 + TF32 matmuls", SDPBackend.MATH, torch.float32, True),
    ("math, f32", SDPBackend.MATH, torch.float32, False),
    ("efficient (CUTLASS), f32", SDPBackend.EFFICIENT_ATTENTION, torch.float32, True),
    ("efficient (CUTLASS), bf16", SDPBackend.EFFICIENT_ATTENTION, torch.bfloat16, True),
    ("flash (FlashAttention-2), bf16", SDPBackend.FLASH_ATTENTION, torch.bfloat16, True),
    ("flash (FlashAttention-2), f16", SDPBackend.FLASH_ATTENTION, torch.float16, True),
    ("cuDNN, bf16", SDPBackend.CUDNN_ATTENTION, torch.bfloat16, True),
]:
    run(name, backend, dtype, tf32)
