"""The trained associative-recall models' implicit attention from Python, through iattn.hf:

    .venv/bin/python examples/python/recall_demo.py [out_dir]

(bash scripts/python.sh --test installs iattn, torch and transformers into .venv.) For one held-out
sequence, each model's layers are decomposed from hooks on its mixers; the script prints what the
query token reads in each layer and in the rollout over the stack (the matching key in brackets),
checks the decompositions against the hooked outputs, and writes per-layer maps, PNGs and an
index.html per model into out_dir (default out/recall).
"""
import os
import sys

import numpy as np
import torch
import transformers

import iattn.hf

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
IDS = [3, 20, 7, 17, 12, 29, 0, 22, 9, 16, 14, 31, 5, 25, 1, 18, 12]  # the query 12's value is 29
KEY, ANSWER = 4, 29


def row(label, values):
    cells = "".join((" [" if s == KEY else "] " if s == KEY + 1 else " ") + f"{v:.3f}" for s, v in enumerate(values))
    print(f"{label:<28}{cells}")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "out", "recall")
    ok = True
    print("tokens:                     " + "".join(f"{t:6d}" for t in IDS))
    for name, cls in [("mamba", transformers.MambaForCausalLM), ("hybrid", transformers.NemotronHForCausalLM)]:
        model = cls.from_pretrained(os.path.join(ROOT, "models", f"recall-{name}")).double().eval()
        ids = torch.tensor([IDS])
        with torch.no_grad():
            predicted = int(model(input_ids=ids).logits[0, -1].argmax())
        ex = iattn.hf.explain(model, input_ids=ids, progress=False)
        for layer, m in zip(ex.layers, ex.layer_maps(0)):
            row(f"{name} layer {layer.index} ({layer.kind}):", m[-1])
        rho = ex.rollout(0)
        row("rollout:", rho[-1])
        top = int(np.argmax(rho[-1, :-1]))
        err = ex.max_relative_error()
        print(f"recall-{name} predicts {predicted} ({'right' if predicted == ANSWER else 'WRONG'}); the query reads most from "
              f"position {top} ({'the matching key' if top == KEY else 'its value' if top == KEY + 1 else 'another token'}); "
              f"decompositions exact to {err:.1e} against the hooked mixers\n")
        ex.save(os.path.join(out, name))
        ok = ok and predicted == ANSWER and err < 1e-6
    print(f"maps, PNGs and index.html in {out}/mamba and {out}/hybrid")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
