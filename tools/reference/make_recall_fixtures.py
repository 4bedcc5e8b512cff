"""Writes tests/data/checkpoint/recall/: transformers' float64 outputs of the shipped associative-recall
checkpoints (models/recall-mamba, models/recall-hybrid) on one held-out sequence, for
tests/checkpoint/recall_checkpoint_test.cpp (the C++ full-stack runners against transformers).

    .venv/bin/python tools/reference/make_recall_fixtures.py
"""
import os

import numpy as np
import torch
import transformers

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "data", "checkpoint", "recall")
IDS = [3, 20, 7, 17, 12, 29, 0, 22, 9, 16, 14, 31, 5, 25, 1, 18, 12]  # the query 12's value is 29


def main():
    os.makedirs(OUT, exist_ok=True)
    np.save(os.path.join(OUT, "ids.npy"), np.array(IDS, np.int64).astype(np.float64))
    for name, cls, layers in [("mamba", transformers.MambaForCausalLM, lambda m: [l.mixer for l in m.backbone.layers]),
                              ("hybrid", transformers.NemotronHForCausalLM, lambda m: [l.mixer for l in m.model.layers])]:
        model = cls.from_pretrained(os.path.join(ROOT, "models", f"recall-{name}")).double().eval()
        outs = {}
        hooks = [mod.register_forward_hook(lambda mod, a, o, i=i: outs.__setitem__(i, (o[0] if isinstance(o, tuple) else o)))
                 for i, mod in enumerate(layers(model))]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([IDS])).logits[0]
        for h in hooks:
            h.remove()
        np.save(os.path.join(OUT, f"{name}_logits.npy"), logits.numpy())
        for i, y in outs.items():
            np.save(os.path.join(OUT, f"{name}_mixer_out_{i}.npy"), y[0].numpy())
        print(name, "argmax at the query:", int(logits[-1].argmax()))
    with open(os.path.join(OUT, "VERSIONS"), "w") as f:
        f.write(f"torch {torch.__version__}\ntransformers {transformers.__version__}\n")


if __name__ == "__main__":
    main()
