#!/usr/bin/env python3
"""Check that PEFT loads an adapter the stack wrote, onto the fixture model.

    python3 scripts/check-peft-adapter.py ADAPTER_DIR [FIXTURE]   # FIXTURE: default fixtures/qwen2-tiny

ADAPTER_DIR holds adapter_config.json and adapter_model.safetensors written
by `qlora::model::adapter::save_adapter` from the fixture's stored LoRA start
(the stack's test `the_fixtures_lora_start_loads_in_peft` writes one and
runs this script where Python has torch, transformers and PEFT).
`PeftModel.from_pretrained` loads it onto the fixture checkpoint; the check
passes (exit 0) when every LoRA factor PEFT holds equals the stored start
and PEFT's logits on the stored token ids are the fixture's `lora_logits`
(rel-L2 <= 1e-5). Exit 1 otherwise. Needs: torch, transformers, peft,
safetensors (versions as scripts/make-qwen2-fixture.py states).
"""

import json
import os
import sys

import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import Qwen2ForCausalLM


def main():
    adapter = sys.argv[1]
    fixture = sys.argv[2] if len(sys.argv) > 2 else "fixtures/qwen2-tiny"
    ref = load_file(os.path.join(fixture, "reference.safetensors"))
    with open(os.path.join(fixture, "reference.json")) as f:
        ids = torch.tensor(json.load(f)["input_ids"])
    base = Qwen2ForCausalLM.from_pretrained(
        fixture, dtype=torch.float32, attn_implementation="eager"
    )
    model = PeftModel.from_pretrained(base, adapter).eval()
    worst = 0.0
    for i, layer in enumerate(model.base_model.model.model.layers):
        for p in ("q_proj", "v_proj"):
            lin = getattr(layer.self_attn, p)
            for f, mod in (("lora_A", lin.lora_A), ("lora_B", lin.lora_B)):
                got, want = mod["default"].weight, ref[f"layers.{i}.{p}.{f}"]
                worst = max(worst, (got - want).abs().max().item())
    with torch.no_grad():
        logits = model(input_ids=ids[:, :-1]).logits
    want = ref["lora_logits"]
    err = ((logits - want).norm() / want.norm()).item()
    print(f"PEFT loaded {adapter}: worst factor difference {worst:.3e}, logits rel-L2 {err:.3e}")
    sys.exit(0 if worst == 0.0 and err <= 1e-5 else 1)


if __name__ == "__main__":
    main()
