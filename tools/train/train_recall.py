"""Trains the tiny associative-recall models that ship in models/ (docs/explainability.md):

    .venv/bin/python tools/train/train_recall.py mamba    # MambaForCausalLM, 2 layers
    .venv/bin/python tools/train/train_recall.py hybrid   # NemotronHForCausalLM: a Mamba-2 block, then attention

CPU only, a few minutes each, seeded (torch, numpy): the same script on the same versions writes the
same weights. Stops when held-out accuracy reaches --target (default 0.99) or after --steps, and saves
the model with save_pretrained (config.json + model.safetensors, float32) into models/recall-<name>/,
with train_log.json (steps, accuracy, versions, seed). The loss is the cross-entropy of the value at
the query position only.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import recall_task as task  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def build(name: str):
    common = dict(vocab_size=task.VOCAB, hidden_size=64, pad_token_id=0, bos_token_id=0, eos_token_id=0, tie_word_embeddings=True)
    if name == "mamba":
        cfg = transformers.MambaConfig(num_hidden_layers=2, state_size=16, expand=2, conv_kernel=4, **common)
        return transformers.MambaForCausalLM(cfg)
    if name == "hybrid":
        # NemotronH: a Mamba-2 block, then a softmax attention block (no positional encoding: the Mamba-2
        # layer below gives the positions), each pre-normed with a residual
        cfg = transformers.NemotronHConfig(layers_block_type=["linear_attention", "full_attention"], num_attention_heads=4,
                                           num_key_value_heads=4, head_dim=16, intermediate_size=128, mamba_num_heads=8,
                                           mamba_head_dim=16, n_groups=1, ssm_state_size=16, conv_kernel=4, chunk_size=32, **common)
        return transformers.NemotronHForCausalLM(cfg)
    raise SystemExit(f"unknown model {name!r}: mamba or hybrid")


def accuracy(model, ids, targets) -> float:
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(ids)).logits[:, -1]
    return float((logits.argmax(-1).numpy() == targets).mean())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("name", choices=["mamba", "hybrid"])
    ap.add_argument("--steps", type=int, default=None, help="the schedule's length (default: mamba 10000, hybrid 4000, "
                    "what the shipped checkpoints used); training stops earlier at --target")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", type=float, default=0.99)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.steps is None:
        a.steps = {"mamba": 10000, "hybrid": 4000}[a.name]
    torch.manual_seed(a.seed)
    torch.set_num_threads(2)
    rng = np.random.default_rng(a.seed)
    held = task.batch(np.random.default_rng(10_000 + a.seed), 512)
    model = build(a.name).float()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=a.lr, total_steps=a.steps, pct_start=0.1)
    t0, log, acc = time.time(), [], 0.0
    for step in range(1, a.steps + 1):
        model.train()
        ids, targets, _ = task.batch(rng, a.batch)
        logits = model(input_ids=torch.from_numpy(ids)).logits[:, -1]
        loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(targets))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0:
            model.eval()
            acc = accuracy(model, *held[:2])
            log.append(dict(step=step, loss=round(float(loss), 4), heldout_accuracy=acc, seconds=round(time.time() - t0, 1)))
            print(log[-1], flush=True)
            if acc >= a.target:
                break
    out = a.out or os.path.join(ROOT, "models", f"recall-{a.name}")
    os.makedirs(out, exist_ok=True)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    with open(os.path.join(out, "train_log.json"), "w") as f:
        json.dump(dict(model=a.name, seed=a.seed, steps=log[-1]["step"] if log else 0, heldout_accuracy=acc, task=dict(
            pairs=task.PAIRS, keys=task.N_KEYS, values=task.N_VALUES, length=task.LENGTH), torch=torch.__version__,
            transformers=transformers.__version__, log=log), f, indent=1)
    size = sum(os.path.getsize(os.path.join(out, p)) for p in os.listdir(out))
    print(f"saved {out} ({size / 1e6:.2f} MB), held-out accuracy {acc:.3f}, {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
