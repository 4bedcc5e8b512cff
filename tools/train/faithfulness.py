"""The faithfulness table of docs/explainability.md: how well each explanation method finds what the
shipped associative-recall models (models/recall-*) actually use.

    .venv/bin/python tools/train/faithfulness.py            # prints the table, writes docs/faithfulness.json

For held-out examples (seeded), every method gives a relevance row for the query token (the last one):
- raw: the mean over layers of each layer's map (mean over channels of |H^c|; attention layers: the
  mean over heads of their probabilities); rollout: the rollout of those maps over the stack;
- Mamba-Attribution (Ali et al.): rollout with each layer's columns scaled by its gradient scores, the
  gradient being the exact one of the frozen decomposition at the query, projected on the unembedding
  of the target value;
- with the exact matrices (iattn's decomposition), with Ali et al.'s S6-only matrices (Mamba-1) and with
  Zimerman et al.'s holistic matrices (Mamba-1 eq. 9, Mamba-2 eq. 11).
Two measures:
- key hit: how often the top-relevance earlier token is the matching key (and how often it is the
  matching key or its value, "pair hit");
- perturbation (Chefer et al.'s positive/negative perturbation): delete the k most (positive) or least
  (negative) relevant earlier tokens, k = 0 .. L-1, and measure the model's accuracy; the AUC is the mean
  accuracy over k. A faithful method has a low positive AUC (removing what it points at breaks the
  model) and a high negative AUC. A random order is the baseline.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import recall_task as task  # noqa: E402

MODELS = {"mamba": "MambaForCausalLM", "hybrid": "NemotronHForCausalLM"}


def load(name: str):
    import transformers
    path = os.path.join(ROOT, "models", f"recall-{name}")
    model = getattr(transformers, MODELS[name]).from_pretrained(path)
    return model.double().eval()


def accuracy(model, ids, targets) -> float:
    import torch
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(np.ascontiguousarray(ids))).logits[:, -1]
    return float((logits.argmax(-1).numpy() == targets).mean())


def variant_maps(ex, model, variant: str, b: int):
    """Per layer (L, L) maps of a paper variant for batch element b (None where the variant has no form)."""
    import iattn
    import iattn.hf as hf
    out = []
    for layer, m in zip(ex.layers, ex.layer_maps(b)):
        if layer.kind == "attention":
            out.append(m)
            continue
        u = np.ascontiguousarray(layer.mixer_input[b])
        if layer.kind == "mamba":
            mixer = model.backbone.layers[layer.index].mixer
            acts = iattn.models.mamba.activations(hf._mamba_weights(mixer), u)
            op = iattn.models.mamba.s6_attention(acts) if variant == "S6-only" else iattn.models.mamba.holistic_attention(acts)
        elif layer.kind == "mamba2":
            if variant == "S6-only":
                return None
            mixer = model.model.layers[layer.index].mixer
            acts = iattn.models.mamba2.activations(hf._mamba2_weights(mixer), u)
            op = iattn.models.mamba2.paper_attention(acts)
        else:
            return None
        out.append(op.mean(abs=True))
    return out


def relevance(model, ids, targets):
    """{method: (n, L) relevance rows of the query token}."""
    import iattn
    import iattn.hf
    ex = iattn.hf.explain(model, input_ids=__import__("torch").from_numpy(ids), progress=False)
    n, L = ids.shape
    q = L - 1
    unembed = model.get_output_embeddings().weight.detach().numpy()
    rows: dict[str, list] = {}

    def add(method, row):
        rows.setdefault(method, []).append(np.asarray(row, np.float64))

    for b in range(n):
        maps = ex.layer_maps(b)
        add("raw, exact", iattn.explain.raw_attention(maps)[q])
        add("rollout, exact", iattn.explain.rollout(maps)[q])
        add("Mamba-Attribution, exact", ex.attribution(b, query=q, target=np.ascontiguousarray(unembed[targets[b]]))[q])
        for variant in ("S6-only", "holistic"):
            vm = variant_maps(ex, model, variant, b)
            if vm is None:
                continue
            add(f"raw, {variant}", iattn.explain.raw_attention(vm)[q])
            add(f"rollout, {variant}", iattn.explain.rollout(vm)[q])
    return {k: np.stack(v) for k, v in rows.items()}, ex.max_relative_error()


def perturbation_auc(model, ids, targets, rel, most_first: bool) -> float:
    """Mean accuracy over k = 0 .. L-1 earlier tokens deleted in order of relevance."""
    n, L = ids.shape
    earlier = rel[:, : L - 1]
    order = np.argsort(-earlier if most_first else earlier, axis=1, kind="stable")
    accs = []
    for k in range(L):
        keep = np.ones((n, L), bool)
        if k:
            np.put_along_axis(keep[:, : L - 1], order[:, :k], False, axis=1)
        accs.append(accuracy(model, ids[keep].reshape(n, L - k), targets))
    return float(np.mean(accs))


def evaluate(name: str, n: int = 200, seed: int = 20_000) -> dict:
    model = load(name)
    ids, targets, where = task.batch(np.random.default_rng(seed), n)
    base = accuracy(model, ids, targets)
    rels, err = relevance(model, ids, targets)
    rng = np.random.default_rng(seed + 1)
    rand = rng.random(ids.shape)
    result = {"model": name, "examples": n, "seed": seed, "accuracy": base, "max_relative_error": err, "methods": {}}
    for method, rel in list(rels.items()) + [("random order", rand)]:
        top = np.argmax(rel[:, : ids.shape[1] - 1], axis=1)
        result["methods"][method] = {
            "key_hit": float(np.mean(top == where)),
            "pair_hit": float(np.mean((top == where) | (top == where + 1))),
            "positive_auc": perturbation_auc(model, ids, targets, rel, True),
            "negative_auc": perturbation_auc(model, ids, targets, rel, False),
        }
    return result


def table(results: list[dict]) -> str:
    lines = []
    for r in results:
        lines.append(f"\n{r['model']} (held-out accuracy {r['accuracy']:.3f} on {r['examples']} examples; decomposition "
                     f"error against the model {r['max_relative_error']:.1e})\n")
        lines.append("| method | key hit | pair hit | positive AUC (lower is better) | negative AUC (higher is better) |")
        lines.append("| --- | --- | --- | --- | --- |")
        for m, v in r["methods"].items():
            lines.append(f"| {m} | {v['key_hit']:.3f} | {v['pair_hit']:.3f} | {v['positive_auc']:.3f} | {v['negative_auc']:.3f} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "faithfulness.json"))
    a = ap.parse_args()
    results = [evaluate(name, a.examples) for name in MODELS]
    print(table(results))
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nwrote {a.out}")


if __name__ == "__main__":
    main()
