"""iattn.hf: the implicit attention of a Hugging Face transformers model, layer by layer.

    import iattn.hf
    ex = iattn.hf.explain(model, input_ids=ids)      # a transformers model, e.g. MambaForCausalLM
    ex.maps()                   # per layer (batch, heads, L, L): bertviz's head_view layout
    ex.rollout(), ex.attribution(query=-1)           # over the whole stack
    ex.max_relative_error()     # each mixer's hooked output against out_proj(H x + beta)
    ex.save("out/")             # .npy maps, PNG heatmaps and an index.html

Forward hooks capture each mixer's input; the architecture's adapter reads the mixer's parameters by
their Hugging Face names and builds iattn's decomposition of that layer; softmax attention layers of
hybrid models contribute their exact attention probabilities (the model runs with eager attention).
See docs/python.md for the supported model types and the exactness each reaches.
"""
from __future__ import annotations

import html
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from . import Weights, models
from . import explain as _explain

__all__ = ["Explanation", "LayerMap", "explain", "supported_model_types"]


# ---- the adapters: one per mixer kind ---------------------------------------------------------------

def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _np(t) -> np.ndarray:
    """A torch tensor as a numpy array without a copy where the dtype allows (detached, on the CPU)."""
    return t.detach().cpu().numpy()


def _row(t) -> np.ndarray:
    return _np(t).reshape(1, -1)


def _dtype_name(t) -> str:
    name = str(t.dtype).replace("torch.", "")
    if name not in ("float32", "float64"):
        raise TypeError(f"iattn.hf: the model's parameters are {name}; call model.float() or model.double() first "
                        "(iattn evaluates in float32 or float64)")
    return name


def _no_bias(module, names, what):
    for n in names:
        lin = getattr(module, n, None)
        if lin is not None and getattr(lin, "bias", None) is not None:
            raise ValueError(f"iattn.hf: {what}.{n} has a bias; the {what} decomposition supports bias-free projections "
                             "only (config use_bias=False, the default)")


def _mamba_weights(mixer) -> Weights:
    _no_bias(mixer, ["in_proj", "out_proj"], "mamba mixer")
    di, N = mixer.A_log.shape
    K = mixer.conv1d.weight.shape[-1]
    dm = mixer.in_proj.weight.shape[1]
    R = mixer.dt_proj.weight.shape[1]
    w = {
        "in_proj_weight": _np(mixer.in_proj.weight),
        "conv1d_weight": _np(mixer.conv1d.weight).reshape(di, K),
        "conv1d_bias": _row(mixer.conv1d.bias) if mixer.conv1d.bias is not None else np.zeros((1, di), _np(mixer.A_log).dtype),
        "x_proj_weight": _np(mixer.x_proj.weight),
        "dt_proj_weight": _np(mixer.dt_proj.weight),
        "dt_proj_bias": _row(mixer.dt_proj.bias),
        "A_log": _np(mixer.A_log),
        "D": _row(mixer.D),
        "out_proj_weight": _np(mixer.out_proj.weight),
    }
    return Weights(w, dict(d_model=dm, d_state=N, d_conv=K, expand=di // dm, dt_rank=R))


def _dt_floor(mixer) -> float:
    """The lower clamp of a Mamba-2 mixer's dt (time_step_limit; nemotron_h and zamba2 hard-code
    (time_step_min, inf)); an upper clamp is refused."""
    lo, hi = (float(v) for v in getattr(mixer, "time_step_limit", (0.0, float("inf"))))
    if hi != float("inf"):
        raise ValueError(f"iattn.hf: the mamba2 mixer clamps dt to ({lo}, {hi}); an upper clamp is not supported")
    return lo


def _mamba2_weights(mixer) -> Weights:
    _no_bias(mixer, ["in_proj", "out_proj"], "mamba2 mixer")
    H = mixer.A_log.shape[0]
    dm = mixer.in_proj.weight.shape[1]
    di = mixer.out_proj.weight.shape[1]
    K = mixer.conv1d.weight.shape[-1]
    G = mixer.n_groups
    N = mixer.ssm_state_size
    conv_dim = di + 2 * G * N
    w = {
        "in_proj_weight": _np(mixer.in_proj.weight),
        "conv1d_weight": _np(mixer.conv1d.weight).reshape(conv_dim, K),
        "conv1d_bias": _row(mixer.conv1d.bias),
        "dt_bias": _row(mixer.dt_bias),
        "A_log": _row(mixer.A_log),
        "D": _row(mixer.D),
        "norm_weight": _row(mixer.norm.weight),
        "out_proj_weight": _np(mixer.out_proj.weight),
    }
    if not hasattr(mixer.norm, "weight"):
        raise ValueError("iattn.hf: the mamba2 mixer has no gated RMS norm (falcon_h1's mamba_rms_norm=False); not supported")
    eps = float(getattr(mixer.norm, "variance_epsilon", getattr(mixer, "layer_norm_epsilon", 1e-5)))
    return Weights(w, dict(d_model=dm, d_state=N, d_conv=K, expand=di // dm, headdim=di // H, ngroups=G, eps=eps,
                           dt_min=_dt_floor(mixer)))


def _rwkv_weights(att) -> Weights:
    Hd = att.key.weight.shape[1]
    A = att.key.weight.shape[0]
    w = {
        "time_decay": _row(att.time_decay),
        "time_first": _row(att.time_first),
        "time_mix_key": _row(att.time_mix_key),
        "time_mix_value": _row(att.time_mix_value),
        "time_mix_receptance": _row(att.time_mix_receptance),
        "key_weight": _np(att.key.weight),
        "value_weight": _np(att.value.weight),
        "receptance_weight": _np(att.receptance.weight),
        "output_weight": _np(att.output.weight),
    }
    return Weights(w, dict(hidden_size=Hd, attention_hidden_size=A, layer_id=int(getattr(att, "layer_id", 0)),
                           num_hidden_layers=int(getattr(att, "layer_id", 0)) + 1))


def _griffin_weights(block) -> Weights:
    D = block.lru_width
    K = block.conv_1d.weight.shape[-1]
    lru = block.rg_lru
    H = lru.num_attention_heads
    bw = D // H
    w = {
        "linear_y_weight": _np(block.linear_y.weight), "linear_y_bias": _row(block.linear_y.bias),
        "linear_x_weight": _np(block.linear_x.weight), "linear_x_bias": _row(block.linear_x.bias),
        "linear_out_weight": _np(block.linear_out.weight), "linear_out_bias": _row(block.linear_out.bias),
        "conv_1d_w": np.ascontiguousarray(_np(block.conv_1d.weight).reshape(D, K).T),
        "conv_1d_b": _row(block.conv_1d.bias),
        "rg_lru_a_param": _row(lru.recurrent_param),
        "rg_lru_input_gate_w": _np(lru.input_gate_weight).reshape(D, bw),
        "rg_lru_input_gate_b": _np(lru.input_gate_bias).reshape(1, D),
        "rg_lru_a_gate_w": _np(lru.recurrent_gate_weight).reshape(D, bw),
        "rg_lru_a_gate_b": _np(lru.recurrent_gate_bias).reshape(1, D),
    }
    return Weights(w, dict(width=block.hidden_size, lru_width=D, num_heads=H))


def _decompose_by_weights(kind, weights_of):
    """A decomposer that maps the module's parameters onto iattn weights and decomposes the hooked input."""
    def run(module, u):
        w = weights_of(module)
        return [getattr(models, kind).decompose(w, np.ascontiguousarray(ub)) for ub in u]
    return run


def _decompose_mamba2(module, u):
    """Mamba-2 by its weights (a dt floor, nemotron_h's and zamba2's time_step_min, is the config's dt_min)."""
    w = _mamba2_weights(module)
    return [models.mamba2.decompose(w, np.ascontiguousarray(ub)) for ub in u]


def _decompose_normed_mamba(module, u):
    """Mamba-1 mixers that normalise dt_in, B and C after x_proj (falcon_mamba: weightless RMS norms, jamba:
    weighted ones): the activations computed with the module's own layers, then iattn's attention(acts)."""
    import torch
    import torch.nn.functional as F

    _no_bias(module, ["in_proj", "out_proj"], "mamba mixer")
    di, N = module.A_log.shape
    R = module.dt_proj.weight.shape[1]
    K = module.conv1d.weight.shape[-1]
    out = []
    with torch.no_grad():
        for ub in u:
            x_in = torch.from_numpy(np.ascontiguousarray(ub)).unsqueeze(0)
            xz = module.in_proj(x_in)[0]
            x, z = xz[:, :di], xz[:, di:]
            p = module.conv1d(x.T.unsqueeze(0))[0, :, : x.shape[0]].T
            a = F.silu(p)
            dt_in, B, C = torch.split(module.x_proj(a), [R, N, N], dim=-1)
            dt_in, B, C = module.dt_layernorm(dt_in), module.b_layernorm(B), module.c_layernorm(C)
            delta = F.softplus(dt_in @ module.dt_proj.weight.T + module.dt_proj.bias)
            acts = {
                "x": _np(x), "z": _np(z), "delta": _np(delta), "A": _np(-torch.exp(module.A_log)),
                "B": _np(B), "C": _np(C), "D": _row(module.D),
                "conv1d_weight": _np(module.conv1d.weight).reshape(di, K),
                "out_proj_weight": _np(module.out_proj.weight),
            }
            if module.conv1d.bias is not None:
                acts["conv1d_bias"] = _row(module.conv1d.bias)
            out.append(models.mamba.attention({k: np.ascontiguousarray(v) for k, v in acts.items()}))
    return out


def _qwen3_next_weights(m) -> Weights:
    K = m.conv1d.weight.shape[-1]
    if m.conv1d.bias is not None:
        raise ValueError("iattn.hf: the qwen3_next mixer's conv1d has a bias; not supported")
    w = {
        "in_proj_qkvz_weight": _np(m.in_proj_qkvz.weight),
        "in_proj_ba_weight": _np(m.in_proj_ba.weight),
        "conv1d_weight": _np(m.conv1d.weight).reshape(m.conv_dim, K),
        "dt_bias": _row(m.dt_bias),
        "A_log": _row(m.A_log),
        "norm_weight": _row(m.norm.weight),
        "out_proj_weight": _np(m.out_proj.weight),
    }
    return Weights(w, dict(hidden_size=m.hidden_size, linear_num_value_heads=m.num_v_heads, linear_num_key_heads=m.num_k_heads,
                           linear_key_head_dim=m.head_k_dim, linear_value_head_dim=m.head_v_dim, linear_conv_kernel_dim=K,
                           rms_norm_eps=float(m.layer_norm_epsilon)))


@dataclass
class _Mixer:
    """One hooked layer: its index, its kind and how to decompose it from the captured input."""
    index: int
    kind: str                      # an iattn.models name ("mamba", "mamba2", ...) or "attention"
    module: Any
    decompose: Callable[[Any, np.ndarray], list] | None = None  # (module, u (batch, L, d)) -> per batch element
    output_of: Callable[[Any], Any] = _first  # the hook's output -> the mixer's output tensor


_MAMBA = _decompose_by_weights("mamba", _mamba_weights)


def _attention(i, module):
    return _Mixer(i, "attention", module)


def _layers_mamba(model):
    backbone = getattr(model, "backbone", model)
    return [_Mixer(i, "mamba", layer.mixer, _MAMBA) for i, layer in enumerate(backbone.layers)]


def _layers_falcon_mamba(model):
    backbone = getattr(model, "backbone", model)
    return [_Mixer(i, "mamba", layer.mixer, _decompose_normed_mamba) for i, layer in enumerate(backbone.layers)]


def _layers_mamba2(model):
    backbone = getattr(model, "backbone", model)
    return [_Mixer(i, "mamba2", layer.mixer, _decompose_mamba2) for i, layer in enumerate(backbone.layers)]


def _layers_hybrid(mamba_attr, decompose, kind):
    """Decoder layers holding either `mamba_attr` (the mixer) or `self_attn` (softmax attention)."""
    def layers(model):
        base = getattr(model, "model", model)
        out = []
        for i, layer in enumerate(base.layers):
            mixer = getattr(layer, mamba_attr, None)
            attn = getattr(layer, "self_attn", None)
            if mixer is not None and attn is not None:
                raise ValueError(f"iattn.hf: layer {i} runs a mixer and attention in parallel; not supported")
            if mixer is not None:
                out.append(_Mixer(i, kind, mixer, decompose))
            elif attn is not None:
                out.append(_attention(i, attn))
        return out
    return layers


def _layers_nemotron_h(model):
    base = getattr(model, "model", model)
    out = []
    for i, layer in enumerate(base.layers):
        kind = getattr(layer, "block_type", None)
        if kind in ("mamba", "linear_attention"):
            out.append(_Mixer(i, "mamba2", layer.mixer, _decompose_mamba2))
        elif kind in ("attention", "full_attention"):
            out.append(_attention(i, layer.mixer))
    return out


def _layers_zamba2(model):
    base = getattr(model, "model", model)
    out = []
    for i, layer in enumerate(base.layers):
        if hasattr(layer, "shared_transformer"):
            out.append(_attention(i, layer.shared_transformer.self_attn))
            out.append(_Mixer(i, "mamba2", layer.mamba_decoder.mamba, _decompose_mamba2))
        else:
            out.append(_Mixer(i, "mamba2", layer.mamba, _decompose_mamba2))
    return out


def _layers_rwkv(model):
    base = getattr(model, "rwkv", model)
    return [_Mixer(i, "rwkv4", block.attention, _decompose_by_weights("rwkv4", _rwkv_weights))
            for i, block in enumerate(base.blocks)]


def _layers_recurrent_gemma(model):
    base = getattr(model, "model", model)
    out = []
    for i, layer in enumerate(base.layers):
        block = layer.temporal_block
        if hasattr(block, "rg_lru"):
            out.append(_Mixer(i, "griffin", block, _decompose_by_weights("griffin", _griffin_weights)))
        else:
            out.append(_attention(i, block))
    return out


def _layers_qwen3_next(model):
    base = getattr(model, "model", model)
    out = []
    for i, layer in enumerate(base.layers):
        if getattr(layer, "linear_attn", None) is not None:
            out.append(_Mixer(i, "qwen3_next", layer.linear_attn, _decompose_by_weights("qwen3_next", _qwen3_next_weights)))
        else:
            out.append(_attention(i, layer.self_attn))
    return out


_ADAPTERS: dict[str, Callable[[Any], list]] = {
    "mamba": _layers_mamba,
    "falcon_mamba": _layers_falcon_mamba,
    "mamba2": _layers_mamba2,
    "jamba": _layers_hybrid("mamba", _decompose_normed_mamba, "mamba"),
    "bamba": _layers_hybrid("mamba", _decompose_mamba2, "mamba2"),
    "granitemoehybrid": _layers_hybrid("mamba", _decompose_mamba2, "mamba2"),
    "nemotron_h": _layers_nemotron_h,
    "zamba2": _layers_zamba2,
    "rwkv": _layers_rwkv,
    "recurrent_gemma": _layers_recurrent_gemma,
    "qwen3_next": _layers_qwen3_next,
}


def supported_model_types() -> list[str]:
    """The transformers model types explain() accepts."""
    return sorted(_ADAPTERS)


# ---- the result -------------------------------------------------------------------------------------

@dataclass
class LayerMap:
    """One layer of an Explanation.

    kind: the mixer kind ("mamba", "mamba2", "rwkv4", "griffin") or "attention" (softmax, exact).
    decompositions: per batch element, the iattn.Decomposition (None for attention layers).
    attention: (batch, heads, L, L) softmax probabilities of an attention layer (None otherwise).
    mixer_input, mixer_output: what the hooks captured, (batch, L, d_model) numpy arrays.
    """
    index: int
    kind: str
    decompositions: list | None
    attention: np.ndarray | None
    mixer_input: np.ndarray
    mixer_output: np.ndarray

    def maps(self, *, abs: bool = True, heads: bool = True) -> np.ndarray:
        """(batch, heads, L, L): per head the mean over its channels of H^c (|H^c| with abs=True), one map when
        the layer has no heads (Mamba-1, RWKV, Griffin) or heads=False; an attention layer's probabilities."""
        if self.attention is not None:
            a = self.attention
            return a if heads else a.mean(axis=1, keepdims=True)
        key = (abs, heads)
        if key not in self._maps:  # computed once per layer and kind (the rollout and friends ask per batch element)
            out = []
            for d in self.decompositions:
                if heads and d.H.head_dim > 1:
                    out.append(d.head_means(abs=abs))
                else:
                    out.append(d.mean(abs=abs)[None])
            self._maps[key] = np.stack(out)
            self._maps[key].flags.writeable = False
        return self._maps[key]

    reconstruction: np.ndarray | None = None
    _maps: dict = field(default_factory=dict, repr=False)

    def relative_error(self) -> float:
        """max |mixer output - out_proj(H x + beta)| / max |mixer output| over the batch; for an attention layer,
        against o_proj(A v) rebuilt from its probabilities A (NaN when the module has no v_proj/o_proj)."""
        y = self.mixer_output
        if self.decompositions is None:
            if self.reconstruction is None:
                return float("nan")
            err = np.abs(self.reconstruction - y).max()
            return float(err / max(np.abs(y).max(), np.finfo(np.float64).tiny))
        err = max(np.abs(d.output() - y[b]).max() for b, d in enumerate(self.decompositions))
        return float(err / max(np.abs(y).max(), np.finfo(np.float64).tiny))


@dataclass
class Explanation:
    """The per-layer implicit attention of one forward pass (see iattn.hf.explain)."""
    model_type: str
    layers: list[LayerMap] = field(default_factory=list)

    def maps(self, *, abs: bool = True, heads: bool = True) -> list[np.ndarray]:
        """Per layer (batch, heads, L, L), the layout bertviz's head_view takes (as torch tensors there)."""
        return [layer.maps(abs=abs, heads=heads) for layer in self.layers]

    def layer_maps(self, batch: int = 0) -> list[np.ndarray]:
        """Per layer one (L, L) map for batch element `batch`: the mean over heads of the |H| maps."""
        return [layer.maps(abs=True)[batch].mean(axis=0) for layer in self.layers]

    def rollout(self, batch: int = 0, *, start_layer: int = 0) -> np.ndarray:
        """Attention rollout over the whole stack, (L, L): row q is token q's relevance over the tokens."""
        return _explain.rollout(self.layer_maps(batch), start_layer=start_layer)

    def raw_attention(self, batch: int = 0) -> np.ndarray:
        """The mean over layers of the per-layer maps, (L, L)."""
        return _explain.raw_attention(self.layer_maps(batch))

    def attribution(self, batch: int = 0, *, query: int = -1, target=None, start_layer: int = 0) -> np.ndarray:
        """Mamba-Attribution (Ali et al.) over the stack, (L, L), with each layer's token scores from the exact
        gradient of its frozen decomposition at `query` projected on `target` (d_model,) (default: the
        mixer's own output at the query, i.e. the direction the layer writes). Attention layers score 1."""
        maps, scores = self.layer_maps(batch), []
        for layer, m in zip(self.layers, maps):
            L = m.shape[0]
            q = query % L
            if layer.decompositions is None:
                scores.append(np.ones((1, L), m.dtype))
                continue
            d = layer.decompositions[batch]
            t = layer.mixer_output[batch, q] if target is None else np.asarray(target, m.dtype)
            scores.append(_explain.gradient_scores(_explain.frozen_gradient(d, q, np.ascontiguousarray(t, dtype=m.dtype))))
        return _explain.mamba_attribution(maps, scores, start_layer=start_layer)

    def max_relative_error(self) -> float:
        """The largest relative error of any layer's decomposition against its hooked mixer output (layers that
        cannot be rebuilt, NaN, are left out)."""
        errors = [e for e in (layer.relative_error() for layer in self.layers) if not np.isnan(e)]
        return max(errors, default=0.0)

    def save(self, directory: str | os.PathLike, *, batch: int = 0, scale: int = 4) -> list[str]:
        """Writes per layer the map .npy (heads, L, L) and a PNG of the head mean, the rollout, and an index.html;
        returns the written paths."""
        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        written, rows = [], []
        for layer in self.layers:
            m = layer.maps(abs=True)[batch]
            stem = f"layer{layer.index:02d}_{layer.kind}"
            np.save(os.path.join(directory, stem + ".npy"), m)
            _explain.save_png(os.path.join(directory, stem + ".png"), _explain.heatmap(m.mean(axis=0), scale=scale))
            written += [stem + ".npy", stem + ".png"]
            rows.append((f"layer {layer.index} ({layer.kind}, {m.shape[0]} head{'s' if m.shape[0] != 1 else ''})", stem + ".png"))
        roll = self.rollout(batch)
        np.save(os.path.join(directory, "rollout.npy"), roll)
        _explain.save_png(os.path.join(directory, "rollout.png"), _explain.heatmap(roll, scale=scale))
        written += ["rollout.npy", "rollout.png"]
        rows.append(("rollout over the stack", "rollout.png"))
        cells = "\n".join(f'<figure><img src="{html.escape(src)}"><figcaption>{html.escape(cap)}</figcaption></figure>'
                          for cap, src in rows)
        page = (f"<!doctype html><meta charset=utf-8><title>iattn: {html.escape(self.model_type)}</title>"
                "<style>body{font-family:sans-serif}figure{display:inline-block;margin:8px}img{image-rendering:pixelated}</style>"
                f"<h1>{html.escape(self.model_type)}: implicit attention per layer</h1>"
                f"<p>Mean over heads of the mean over channels of |H<sup>c</sup>| (viridis, min-max per map). "
                f"Max relative error of the decompositions against the hooked mixer outputs: {self.max_relative_error():.2e}.</p>\n{cells}\n")
        with open(os.path.join(directory, "index.html"), "w", encoding="utf-8") as f:
            f.write(page)
        written.append("index.html")
        return [os.path.join(directory, p) for p in written]


# ---- explain ----------------------------------------------------------------------------------------

def _attention_output(module, u, probs):
    """o_proj(A v) from an attention module's probabilities A (batch, heads, L, L) and its input u, where it
    has v_proj and o_proj (grouped key/value heads repeated): the check that the maps are the layer's own."""
    import torch

    if not (hasattr(module, "v_proj") and hasattr(module, "o_proj")):
        return None
    cfg = getattr(module, "config", None)
    if getattr(cfg, "use_shared_attention_adapter", False):  # zamba2: v = v_proj(x) + adapter(x), not rebuilt here
        return None
    with torch.no_grad():
        B, L, _ = u.shape
        heads = probs.shape[1]
        v = module.v_proj(u)
        hd = getattr(module, "head_dim", None) or v.shape[-1] // heads
        kv = v.shape[-1] // hd
        v = v.view(B, L, kv, hd).transpose(1, 2).repeat_interleave(heads // kv, dim=1)
        y = torch.matmul(probs.to(v.dtype), v).transpose(1, 2).reshape(B, L, heads * hd)
        q = getattr(module, "q_proj", None)
        if q is not None and q.out_features == 2 * heads * hd:  # qwen3_next: an output gate from q_proj's second half
            gate = q(u).view(B, L, heads, 2 * hd)[..., hd:].reshape(B, L, heads * hd)
            y = y * torch.sigmoid(gate)
        return _np(module.o_proj(y))


class _Progress:
    """A one-line progress bar on stderr (no dependency), shown for more than one step."""

    def __init__(self, total: int, enabled: bool, label: str):
        self.total, self.enabled, self.label, self.done = total, enabled and total > 1, label, 0

    def step(self):
        self.done += 1
        if self.enabled:
            n = 30 * self.done // self.total
            sys.stderr.write(f"\r{self.label} [{'#' * n}{'.' * (30 - n)}] {self.done}/{self.total}")
            if self.done == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


def explain(model, input_ids=None, *, inputs_embeds=None, progress: bool | None = None, **forward_kwargs) -> Explanation:
    """Runs `model` once (no gradients) with forward hooks on its mixers and returns every layer's implicit
    attention as an Explanation.

    model: a transformers model (e.g. MambaForCausalLM) in float32 or float64 whose config.model_type is
    one of supported_model_types(). input_ids (batch, L) or inputs_embeds (batch, L, d_model); other
    keyword arguments go to the model's forward. Padding is not supported (no attention_mask with zeros).
    progress: a progress bar over the layers on stderr (default: when stderr is a terminal).
    """
    import torch

    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in _ADAPTERS:
        raise ValueError(f"iattn.hf.explain: model type {model_type!r} is not supported; supported: "
                         + ", ".join(supported_model_types()))
    mask = forward_kwargs.get("attention_mask")
    if mask is not None and not bool(torch.all(mask != 0)):
        raise ValueError("iattn.hf.explain: attention_mask has padding (zeros); explain one unpadded sequence per row")
    mixers = _ADAPTERS[model_type](model)
    dtype = _dtype_name(next(model.parameters()))
    captured: dict[int, tuple] = {}  # by position in `mixers` (a zamba2 layer has two)
    hooks = []
    has_attention = any(m.kind == "attention" for m in mixers)
    previous_impl = getattr(model.config, "_attn_implementation", None)
    if has_attention:
        model.set_attn_implementation("eager")  # the attention modules then return their probabilities
    try:
        for k, m in enumerate(mixers):
            def hook(module, args, kwargs, output, k=k):
                u = args[0] if args else kwargs.get("hidden_states", next(iter(kwargs.values())))
                captured[k] = (u, kwargs, output)
            hooks.append(m.module.register_forward_hook(hook, with_kwargs=True))
        with torch.no_grad():
            if inputs_embeds is not None:
                model(inputs_embeds=inputs_embeds, **forward_kwargs)
            else:
                model(input_ids=input_ids, **forward_kwargs)
    finally:
        for h in hooks:
            h.remove()
        if has_attention and previous_impl is not None:
            model.set_attn_implementation(previous_impl)

    if progress is None:
        progress = sys.stderr.isatty()
    bar = _Progress(len(mixers), progress, f"iattn: {model_type}")
    ex = Explanation(model_type)
    for k, m in enumerate(mixers):
        if k not in captured:
            raise RuntimeError(f"iattn.hf.explain: layer {m.index}'s {m.kind} module was not called by the forward pass")
        u, kwargs, out = captured[k]
        if m.kind == "attention":
            if not isinstance(out, (tuple, list)) or len(out) < 2 or out[1] is None:
                raise RuntimeError(f"iattn.hf.explain: layer {m.index}'s attention returned no probabilities under eager attention")
            probs = _np(out[1]).astype(dtype)
            layer = LayerMap(m.index, "attention", None, probs, _np(u), _np(_first(out)))
            layer.reconstruction = _attention_output(m.module, u, out[1])
            ex.layers.append(layer)
            bar.step()
            continue
        u_np, y_np = _np(u), _np(m.output_of(out))
        if m.kind == "griffin":
            pos = kwargs.get("position_ids")
            if pos is not None and not np.array_equal(_np(pos), np.broadcast_to(np.arange(u_np.shape[1]), _np(pos).shape)):
                raise ValueError("iattn.hf.explain: position_ids other than 0..L-1 are not supported for recurrent_gemma")
        decs = m.decompose(m.module, u_np)
        ex.layers.append(LayerMap(m.index, m.kind, decs, None, u_np, y_np))
        bar.step()
    return ex
