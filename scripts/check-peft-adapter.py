#!/usr/bin/env python3
"""Check that PEFT loads an adapter the stack wrote, onto the fixture model.

    python3 scripts/check-peft-adapter.py ADAPTER_DIR [FIXTURE]
    python3 scripts/check-peft-adapter.py --against LOGITS ADAPTER_DIR [FIXTURE]

FIXTURE defaults to fixtures/qwen2-tiny. ADAPTER_DIR holds
adapter_config.json and adapter_model.safetensors written by
`qlora::model::adapter::save_adapter`; `PeftModel.from_pretrained` loads it
onto the fixture checkpoint and PEFT computes the logits of the fixture's
stored token ids (inputs `ids[:, :-1]`).

Without --against, the adapter holds the fixture's stored LoRA start (the
stack's test `the_fixtures_lora_start_loads_in_peft` writes one and runs this
where Python has torch, transformers and PEFT): the check passes (exit 0)
when every LoRA factor PEFT holds equals the stored start and PEFT's logits
are the fixture's `lora_logits` (rel-L2 <= 1e-5).

With --against, the adapter is one the stack trained (the `peft_round_trip`
check): LOGITS is a safetensors file whose tensor `logits` [batch, seq,
vocab] holds the stack's own logits of the same tokens. The script prints,
as its last line, a JSON object with `logits_rel_l2` (||z_peft - z|| / ||z||)
and `versions`, and exits 0; the check judges the number.

Needs: torch, transformers, peft, safetensors (versions as
scripts/make-qwen2-fixture.py states).
"""

import json
import os
import sys

import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import Qwen2ForCausalLM


def versions():
    import peft
    import transformers

    return f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}"


def peft_logits(adapter, fixture, ids):
    base = Qwen2ForCausalLM.from_pretrained(
        fixture, dtype=torch.float32, attn_implementation="eager"
    )
    model = PeftModel.from_pretrained(base, adapter).eval()
    with torch.no_grad():
        return model, model(input_ids=ids[:, :-1]).logits


def against(logits_file, adapter, fixture):
    with open(os.path.join(fixture, "reference.json")) as f:
        ids = torch.tensor(json.load(f)["input_ids"])
    ours = load_file(logits_file)["logits"]
    _, logits = peft_logits(adapter, fixture, ids)
    err = ((logits - ours).norm() / ours.norm()).item()
    print(f"PEFT loaded {adapter}: logits rel-L2 against the stack's {err:.3e}")
    print(json.dumps({"logits_rel_l2": err, "versions": versions()}))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--against":
        fixture = sys.argv[4] if len(sys.argv) > 4 else "fixtures/qwen2-tiny"
        against(sys.argv[2], sys.argv[3], fixture)
        return
    adapter = sys.argv[1]
    fixture = sys.argv[2] if len(sys.argv) > 2 else "fixtures/qwen2-tiny"
    ref = load_file(os.path.join(fixture, "reference.safetensors"))
    with open(os.path.join(fixture, "reference.json")) as f:
        ids = torch.tensor(json.load(f)["input_ids"])
    model, logits = peft_logits(adapter, fixture, ids)
    worst = 0.0
    for i, layer in enumerate(model.base_model.model.model.layers):
        for p in ("q_proj", "v_proj"):
            lin = getattr(layer.self_attn, p)
            for f, mod in (("lora_A", lin.lora_A), ("lora_B", lin.lora_B)):
                got, want = mod["default"].weight, ref[f"layers.{i}.{p}.{f}"]
                worst = max(worst, (got - want).abs().max().item())
    want = ref["lora_logits"]
    err = ((logits - want).norm() / want.norm()).item()
    print(f"PEFT loaded {adapter}: worst factor difference {worst:.3e}, logits rel-L2 {err:.3e}")
    sys.exit(0 if worst == 0.0 and err <= 1e-5 else 1)


if __name__ == "__main__":
    main()
