#!/usr/bin/env python3
"""The PyTorch peer of the qlora training step: the same LoRA step on a Qwen2
decoder, written by hand the way a user who knows PyTorch would write it
fast, timed on one GPU.

The work is the falsify step's: per layer RMSNorm, q/k/v with bias (LoRA
`y += s (x A^T) B^T` on q and v, `s = 2`), RoPE, causal grouped-query
attention (`scaled_dot_product_attention`), o, residual, RMSNorm, SwiGLU MLP,
residual; final RMSNorm, the LM head (the embedding where tied), mean
cross-entropy; the LoRA factors and both norm weights of every layer train
(f32 master weights) with a global gradient clip (max norm 1) and AdamW.

Precision `bf16`: frozen weights stored in bf16 and the forward under bf16
autocast. Precision `tf32`: frozen weights in f32, TF32 matmuls. Either way
the loss function is `torch.compile`d (Inductor) and the whole step (forward,
backward, clip, AdamW) is captured once in a CUDA graph and replayed; each
step copies its batch into the graph's input first.

    python3 scripts/peers/qwen2_lora_step.py --config '{"layers": 24, ...}' \
        --precision bf16 [--warmup 5] [--repeats 20] [--device 0] \
        [--bus-id 00000000:19:00.0]

The last line of stdout is JSON: tokens_per_s (batch x seq / median step
time), median_ms, step_ms (every timed step), last_loss, setup_s (everything
before the timed steps: weights, compilation, capture), versions, and on a
GPU peak_reserved_bytes (PyTorch's allocator), device_used_bytes (total -
free on the device after the run, as the driver reports it: this process's
memory and context, and any other process's on the device) and
driver_memory: this process's id and nvidia-smi's per-process rows
(`--query-compute-apps=pid,used_memory`, MiB, of the GPU `--bus-id` names,
else of every GPU), read after the timed steps, when the caching allocator
still holds its peak; `rows` is null with the reason in `error` where
nvidia-smi did not answer. The harness reads this process's row the way it
reads its own. driver_memory is null on the CPU.
`--cpu` runs it eagerly on the CPU for a quick check (nothing compiled,
no graph, timings meaningless).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import time

import torch
import torch.nn.functional as F

LORA_SCALE = 2.0
CONFIG_KEYS = ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate",
               "vocab", "seq_len", "batch", "lora_rank", "qkv_bias", "tied_embeddings",
               "rope_theta", "rms_eps")


def uniform_draw(shape, std, gen):
    """Values of U(-sqrt(3) std, sqrt(3) std) (standard deviation `std`), on the CPU in f32."""
    return (torch.rand(shape, generator=gen) * 2 - 1) * (math.sqrt(3.0) * std)


def frozen_weights(c, dtype, device, gen):
    """Seeded frozen tensors: projections U with std 1/sqrt(in), the
    embedding at the head's scale where tied, biases zero, norms one."""
    def uniform(shape, std):
        return uniform_draw(shape, std, gen).to(device=device, dtype=dtype)

    h, qd, kvd, inter = c["hidden"], c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"], c["intermediate"]
    layers = []
    for _ in range(c["layers"]):
        w = {
            "q": uniform((qd, h), h ** -0.5), "k": uniform((kvd, h), h ** -0.5),
            "v": uniform((kvd, h), h ** -0.5), "o": uniform((h, qd), qd ** -0.5),
            "gate": uniform((inter, h), h ** -0.5), "up": uniform((inter, h), h ** -0.5),
            "down": uniform((h, inter), inter ** -0.5),
        }
        if c["qkv_bias"]:
            for name, n in (("bq", qd), ("bk", kvd), ("bv", kvd)):
                w[name] = torch.zeros(n, device=device, dtype=dtype)
        layers.append(w)
    head_std = h ** -0.5
    embedding = uniform((c["vocab"], h), head_std if c["tied_embeddings"] else 1.0)
    head = embedding if c["tied_embeddings"] else uniform((c["vocab"], h), head_std)
    final_norm = torch.ones(h, device=device, dtype=dtype)
    return layers, embedding, head, final_norm


def trainable_weights(c, device, gen):
    """f32 master weights: LoRA A (r x in) random, B (out x r) zero, norms one."""
    h, r = c["hidden"], c["lora_rank"]
    qd, kvd = c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
    params = []
    for _ in range(c["layers"]):
        t = {
            "aq": uniform_draw((r, h), h ** -0.5, gen), "bq": torch.zeros(qd, r),
            "av": uniform_draw((r, h), h ** -0.5, gen), "bv": torch.zeros(kvd, r),
            "norm1": torch.ones(h), "norm2": torch.ones(h),
        }
        params.append({k: v.to(device).requires_grad_() for k, v in t.items()})
    return params


def rope_tables(c, device):
    d = c["head_dim"]
    inv = c["rope_theta"] ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(c["seq_len"], dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().float().to(device), ang.sin().float().to(device)


def rope(x, cos, sin):
    # x [b, heads, s, d]: the two halves turn together (Hugging Face's rotate_half).
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rms_norm(x, g, eps):
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * g.float()).to(x.dtype)


def make_loss(c, frozen, trainable, tables):
    layers, embedding, head, final_norm = frozen
    cos, sin = tables
    b, s, hd = c["batch"], c["seq_len"], c["head_dim"]
    nh, nkv, eps = c["heads"], c["kv_heads"], c["rms_eps"]

    def lora(x, w, a, bmat):
        return x @ w.t() + LORA_SCALE * ((x @ a.t().to(x.dtype)) @ bmat.t().to(x.dtype))

    def loss_fn(tokens, targets):
        x = F.embedding(tokens, embedding)
        for w, t in zip(layers, trainable):
            h = rms_norm(x, t["norm1"], eps)
            q = lora(h, w["q"], t["aq"], t["bq"])
            k = h @ w["k"].t()
            v = lora(h, w["v"], t["av"], t["bv"])
            if "bq" in w:
                q, k, v = q + w["bq"], k + w["bk"], v + w["bv"]
            q = rope(q.view(b, s, nh, hd).transpose(1, 2), cos, sin)
            k = rope(k.view(b, s, nkv, hd).transpose(1, 2), cos, sin)
            v = v.view(b, s, nkv, hd).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + a.transpose(1, 2).reshape(b, s, nh * hd) @ w["o"].t()
            h = rms_norm(x, t["norm2"], eps)
            x = x + (F.silu(h @ w["gate"].t()) * (h @ w["up"].t())) @ w["down"].t()
        x = rms_norm(x, final_norm, eps)
        logits = x @ head.t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))

    return loss_fn


def driver_memory(bus_id):
    """This process's id and nvidia-smi's rows `pid, used_memory` (MiB, the
    driver's per-process figure, context included) of the GPU `bus_id`
    names (every GPU where None); rows None and the reason where
    nvidia-smi did not answer."""
    cmd = ["nvidia-smi"] + (["-i", bus_id] if bus_id else [])
    cmd += ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
    found = {"pid": os.getpid(), "rows": None, "error": None}
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        found["error"] = f"nvidia-smi not run: {e}"
        return found
    if out.returncode != 0:
        found["error"] = f"nvidia-smi failed (exit {out.returncode}): {out.stdout.strip()} {out.stderr.strip()}".strip()
    else:
        found["rows"] = out.stdout
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="JSON object with " + ", ".join(CONFIG_KEYS))
    ap.add_argument("--precision", choices=("bf16", "tf32"), required=True)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bus-id", help="PCI bus id of the GPU, as nvidia-smi -i takes it")
    ap.add_argument("--cpu", action="store_true")
    args = ap.parse_args()
    c = json.loads(args.config)
    missing = [k for k in CONFIG_KEYS if k not in c]
    if missing:
        raise SystemExit(f"--config lacks {', '.join(missing)}")
    started = time.perf_counter()
    cuda = not args.cpu
    device = torch.device(f"cuda:{args.device}" if cuda else "cpu")
    before_free, total = (0, 0)
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
        torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    frozen_dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    gen = torch.Generator().manual_seed(args.seed)
    frozen = frozen_weights(c, frozen_dtype, device, gen)
    trainable = trainable_weights(c, device, gen)
    params = [p for t in trainable for p in t.values()]
    loss_fn = make_loss(c, frozen, trainable, rope_tables(c, device))
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0, capturable=cuda, fused=cuda)
    shape = (c["batch"], c["seq_len"])
    batches = [torch.randint(0, c["vocab"], (2,) + shape, generator=gen).to(device) for _ in range(8)]
    tokens, targets = batches[0][0].clone(), batches[0][1].clone()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")
    compiled = torch.compile(loss_fn) if cuda else loss_fn

    def step():
        with autocast:
            loss = compiled(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=False)
        return loss

    run = step
    if cuda:
        # Compile and settle on a side stream, then capture the whole step.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_loss = step()

        def run():
            graph.replay()
            return static_loss

    def one(i):
        tokens.copy_(batches[i % len(batches)][0])
        targets.copy_(batches[i % len(batches)][1])
        return run()

    for i in range(args.warmup):
        loss = one(i)
    step_ms = []
    for i in range(args.repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            loss = one(i)
            end.record()
            end.synchronize()
            step_ms.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            loss = one(i)
            step_ms.append((time.perf_counter() - t) * 1e3)
    med = statistics.median(step_ms)
    out = {
        "tokens_per_s": c["batch"] * c["seq_len"] / med * 1e3,
        "median_ms": med,
        "step_ms": step_ms,
        "last_loss": loss.item(),
        "precision": args.precision,
        "setup_s": time.perf_counter() - started - sum(step_ms) / 1e3,
        "versions": f"torch {torch.__version__}",
        "driver_memory": driver_memory(args.bus_id) if cuda else None,
    }
    if cuda:
        free, total = torch.cuda.mem_get_info(device)
        out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
        out["device_used_bytes"] = total - free
        out["device"] = torch.cuda.get_device_name(device)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
