#!/usr/bin/env python3
"""Make fixtures/qwen2-tiny/: a tiny random Qwen2 saved by transformers, and
transformers' and PEFT's outputs on it, the reference the CPU oracle is held to.

    pip install --no-cache-dir torch transformers peft safetensors
    python3 scripts/make-qwen2-fixture.py [OUT]   # OUT: default fixtures/qwen2-tiny

Committed fixture made with: Python 3.11.7, torch 2.15.0 (CPU), transformers
5.24.0, peft 0.21.2, safetensors 0.8.0 (reference.json records the versions
of the run that wrote it; transformers 5 writes RoPE theta as
`rope_parameters.rope_theta` in config.json, 4.x as `rope_theta`). Everything runs in f32 on the CPU and is seeded, so a
rerun with these versions rewrites the same bytes.

Writes into OUT:

- config.json, model.safetensors: `save_pretrained` of a Qwen2ForCausalLM with
  2 layers, hidden 64, 4 heads, 2 kv heads (head_dim 16), intermediate 128,
  vocabulary 256, q/k/v bias, tied embeddings, rope_theta 25000 and
  rms_norm_eps 1e-3 (neither is a default, so a wrong constant shows). The
  weights are redrawn from a seeded generator so that every tensor matters:
  projections N(0, 1/in), biases N(0, 0.1^2), norm weights 1 + N(0, 0.1^2),
  embedding N(0, 0.2^2) (the tied head makes the logits `h E^T`).
- reference.safetensors: for token ids `ids` [2, 17] (inputs `ids[:, :16]`,
  targets `ids[:, 1:]`): `logits` [2, 16, 256] and `loss` [1] (mean
  next-token cross-entropy over the 32 positions) of the base model; with a
  PEFT LoRA (r 8, alpha 16, no dropout) on q_proj and v_proj at a fixed
  non-zero start (A ~ N(0, 1/in), B ~ N(0, 0.05^2), so neither gradient
  vanishes): `lora_logits`, `lora_loss`, and for every layer i and
  projection p in {q_proj, v_proj}: `layers.{i}.{p}.lora_{A,B}` (the start)
  and `layers.{i}.{p}.lora_{A,B}.grad` (dloss/d of it). A is [r, in], B is
  [out, r], PEFT's layout.
- reference.json: the token ids, the LoRA r/alpha/targets/start, the loss
  values, and the library versions.
"""

import json
import math
import os
import platform
import sys

import peft
import safetensors
import safetensors.torch
import torch
import transformers
from peft import LoraConfig, get_peft_model
from transformers import Qwen2Config, Qwen2ForCausalLM

SEED = 20241126
BATCH, SEQ, VOCAB = 2, 16, 256
R, ALPHA = 8, 16
TARGETS = ["q_proj", "v_proj"]
B_STD = 0.05


def config():
    return Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_theta=25000.0,
        rms_norm_eps=1e-3,
        tie_word_embeddings=True,
        use_sliding_window=False,
        attn_implementation="eager",
        torch_dtype="float32",
    )


def redraw(model, gen):
    """Every parameter from `gen`, by its role (the scales in the docstring)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.1 * noise)
            elif "embed_tokens" in name:
                p.copy_(0.2 * noise)
            else:
                p.copy_(noise / math.sqrt(p.shape[1]))


def next_token_loss(logits, ids):
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1), reduction="mean"
    )


def lora_outputs(model, ids, gen):
    """PEFT LoRA at a fixed start: logits, loss, and per factor start and gradient."""
    cfg = LoraConfig(
        r=R, lora_alpha=ALPHA, target_modules=TARGETS, lora_dropout=0.0, bias="none"
    )
    pm = get_peft_model(model, cfg)
    factors = {}
    with torch.no_grad():
        for i, layer in enumerate(pm.base_model.model.model.layers):
            for p in TARGETS:
                lin = getattr(layer.self_attn, p)
                a, b = lin.lora_A["default"].weight, lin.lora_B["default"].weight
                a.copy_(torch.randn(a.shape, generator=gen) / math.sqrt(a.shape[1]))
                b.copy_(B_STD * torch.randn(b.shape, generator=gen))
                factors[f"layers.{i}.{p}.lora_A"] = a
                factors[f"layers.{i}.{p}.lora_B"] = b
    logits = pm(input_ids=ids[:, :SEQ]).logits
    loss = next_token_loss(logits, ids)
    loss.backward()
    out = {"lora_logits": logits.detach(), "lora_loss": loss.detach().reshape(1)}
    for k, t in factors.items():
        out[k] = t.detach().clone()
        out[k + ".grad"] = t.grad.detach().clone()
    return out, loss.item()


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "fixtures/qwen2-tiny"
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    model = Qwen2ForCausalLM(config()).to(torch.float32).eval()
    redraw(model, gen)
    model.save_pretrained(out_dir, safe_serialization=True)

    ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen)
    with torch.no_grad():
        logits = model(input_ids=ids[:, :SEQ]).logits
        loss = next_token_loss(logits, ids)
    tensors = {"logits": logits.contiguous(), "loss": loss.reshape(1)}
    lora, lora_loss = lora_outputs(model, ids, gen)
    tensors.update(lora)
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    safetensors.torch.save_file(tensors, os.path.join(out_dir, "reference.safetensors"))

    meta = {
        "input_ids": ids.tolist(),
        "inputs": "input_ids[:, :16]",
        "targets": "input_ids[:, 1:]",
        "loss": loss.item(),
        "lora_loss": lora_loss,
        "lora": {
            "r": R,
            "alpha": ALPHA,
            "scale": ALPHA / R,
            "target_modules": TARGETS,
            "dropout": 0.0,
            "init": f"A ~ N(0, 1/in), B ~ N(0, {B_STD}^2), seeded; stored in reference.safetensors",
        },
        "seed": SEED,
        "dtype": "float32",
        "attn_implementation": "eager",
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
            "safetensors": safetensors.__version__,
        },
    }
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(f"wrote {out_dir}: loss {loss.item():.6f}, lora loss {lora_loss:.6f}")


if __name__ == "__main__":
    main()
