#!/usr/bin/env python3
"""Writes tests/data/checkpoint/: tiny random MambaForCausalLM and Mamba2ForCausalLM models saved by
transformers' save_pretrained (model.safetensors, float32), and, for one input, every layer's mixer
input and output from transformers' own forward in float64 (the model's float32 weights cast to
double), for tests/checkpoint/mamba_checkpoint_test.cpp. (Mamba-2's torch path computes its scan
and gated norm in float32 whatever the model's dtype, so its outputs are float32-accurate.)

    bash tools/reference/setup_venv.sh && .venv/bin/python tools/reference/make_checkpoint_fixtures.py

Files: <model>/model.safetensors, <model>/config.json, <model>/mixer_in_<i>.npy and
<model>/mixer_out_<i>.npy (L, hidden_size) float64, input_ids.npy and logits.npy (L, vocab), for <model> in mamba, mamba2, rwkv (the time
mixing of each block), recurrent_gemma (each recurrent block; transformers runs its RG-LRU scan in
float32).
"""
import os
import shutil
import tempfile

import numpy as np
import torch
from transformers import (Mamba2Config, Mamba2ForCausalLM, MambaConfig, MambaForCausalLM, RecurrentGemmaConfig,
                          RecurrentGemmaForCausalLM, RwkvConfig, RwkvForCausalLM)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "checkpoint")


def write(name, model, vocab_size):
    OUT = os.path.join(ROOT, name)
    rwkv, rg = name == "rwkv", name == "recurrent_gemma"
    if rwkv:
        mixers = [b.attention for b in model.rwkv.blocks]
    elif rg:
        mixers = [layer.temporal_block for layer in model.model.layers]
    else:
        mixers = [layer.mixer for layer in model.backbone.layers]
    with torch.no_grad():  # move the constant initial values so every field matters
        for m in mixers:
            if rwkv:
                m.time_first.add_(0.3 * torch.randn_like(m.time_first))
                m.time_decay.add_(0.3 * torch.randn_like(m.time_decay))
            elif rg:
                for prm in [m.conv_1d.bias, m.linear_x.bias, m.rg_lru.input_gate_bias, m.rg_lru.recurrent_gate_bias]:
                    prm.add_(0.3 * torch.randn_like(prm))
            else:
                m.D.add_(0.3 * torch.randn_like(m.D))
                m.A_log.add_(0.2 * torch.randn_like(m.A_log))
    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        shutil.copy(os.path.join(tmp, "model.safetensors"), os.path.join(OUT, "model.safetensors"))
        shutil.copy(os.path.join(tmp, "config.json"), os.path.join(OUT, "config.json"))
    model = model.double()
    captured = {}

    def hook(i):
        def fn(module, args, kwargs, output):
            x = args[0] if args else kwargs["hidden_states"]
            y = output[0] if isinstance(output, tuple) else output
            captured[i] = (x[0].detach().numpy(), y[0].detach().numpy())
        return fn

    for i, m in enumerate(mixers):
        m.register_forward_hook(hook(i), with_kwargs=True)
    ids = torch.randint(0, vocab_size, (1, 11))
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=False)
    np.save(os.path.join(OUT, "input_ids.npy"), ids[0].numpy().astype(np.float64))
    np.save(os.path.join(OUT, "logits.npy"), out.logits[0].detach().numpy().astype(np.float64))
    for i, (x, y) in captured.items():
        np.save(os.path.join(OUT, f"mixer_in_{i}.npy"), x.astype(np.float64))
        np.save(os.path.join(OUT, f"mixer_out_{i}.npy"), y.astype(np.float64))
    print("wrote", OUT, sorted(os.listdir(OUT)))


def main():
    torch.manual_seed(20261125)
    cfg = MambaConfig(vocab_size=40, hidden_size=16, state_size=4, num_hidden_layers=2, expand=2, conv_kernel=4,
                      time_step_rank=3, use_conv_bias=True, use_bias=False)
    write("mamba", MambaForCausalLM(cfg).eval(), cfg.vocab_size)
    cfg2 = Mamba2Config(vocab_size=40, hidden_size=16, state_size=8, num_heads=8, head_dim=4, expand=2, n_groups=2,
                        conv_kernel=4, num_hidden_layers=2, chunk_size=4, use_conv_bias=True, use_bias=False,
                        layer_norm_epsilon=1e-5)
    write("mamba2", Mamba2ForCausalLM(cfg2).eval(), cfg2.vocab_size)
    cfg3 = RwkvConfig(vocab_size=40, hidden_size=16, attention_hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      context_length=64, rescale_every=0)
    write("rwkv", RwkvForCausalLM(cfg3).eval(), cfg3.vocab_size)
    cfg4 = RecurrentGemmaConfig(vocab_size=40, hidden_size=16, lru_width=24, num_attention_heads=4, num_key_value_heads=1,
                                intermediate_size=32, num_hidden_layers=2, block_types=["recurrent"], conv1d_width=4,
                                attention_window_size=16)
    write("recurrent_gemma", RecurrentGemmaForCausalLM(cfg4).eval(), cfg4.vocab_size)


if __name__ == "__main__":
    main()
