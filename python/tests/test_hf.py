"""iattn.hf against transformers: tiny random models (as transformers' own tests build them), each hooked
mixer's output against out_proj(H x + beta) from iattn, in float64 and float32.

transformers computes parts of some mixers in float32 even in model.double() (A = -exp(A_log.float()),
the scans' .float() casts, RWKV's float32 states; docs/python.md lists the lines), so the float64 bounds
below are those casts' rounding, not iattn's: iattn's own double oracles agree to 1e-10 (test_models.py).
"""
import os

import numpy as np
import pytest

if os.environ.get("IATTN_REQUIRE_HF") == "1":  # scripts/python.sh --test: missing is a failure, not a skip
    import torch
    import transformers
else:
    torch = pytest.importorskip("torch", reason="the bridge tests need torch (scripts/python.sh --test installs it)")
    transformers = pytest.importorskip("transformers")

import iattn  # noqa: E402
import iattn.hf  # noqa: E402

L, BATCH, VOCAB = 19, 2, 64


# Tiny configs as transformers' own tests build them (hybrids with mixer and attention layers, no MoE),
# and the float64 bound each reaches against transformers (its float32 casts; docs/python.md).
TINY = {
    "mamba": ("MambaConfig", "MambaForCausalLM", 1e-9,
              dict(hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4)),
    "falcon_mamba": ("FalconMambaConfig", "FalconMambaForCausalLM", 1e-6,
                     dict(hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4)),
    "mamba2": ("Mamba2Config", "Mamba2ForCausalLM", 1e-6,
               dict(hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, head_dim=16, num_heads=4, n_groups=2,
                    conv_kernel=4, chunk_size=8)),
    "jamba": ("JambaConfig", "JambaForCausalLM", 1e-6,
              dict(hidden_size=32, num_hidden_layers=4, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                   attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, num_experts=1,
                   mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4)),
    "bamba": ("BambaConfig", "BambaForCausalLM", 1e-6,
              dict(hidden_size=32, num_hidden_layers=4, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                   attn_layer_indices=[1, 3], mamba_n_heads=8, mamba_d_head="auto", mamba_n_groups=2, mamba_d_state=8,
                   mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8)),
    "zamba2": ("Zamba2Config", "Zamba2ForCausalLM", 1e-6,
               dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, intermediate_size=64,
                    layers_block_type=["linear_attention", "hybrid", "linear_attention", "hybrid"], mamba_d_state=8,
                    n_mamba_heads=8, mamba_ngroups=2, mamba_expand=2, chunk_size=8, num_mem_blocks=1,
                    use_shared_attention_adapter=True, adapter_rank=4, use_mem_rope=True)),
    "nemotron_h": ("NemotronHConfig", "NemotronHForCausalLM", 1e-6,
                   dict(hidden_size=32, layers_block_type=["linear_attention", "full_attention", "mlp", "linear_attention"],
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64, mamba_num_heads=8,
                        mamba_head_dim=8, n_groups=2, ssm_state_size=8, conv_kernel=4, chunk_size=8)),
    "granitemoehybrid": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", 1e-6,
                         dict(hidden_size=32, num_hidden_layers=4, intermediate_size=64, num_attention_heads=4,
                              num_key_value_heads=2, mamba_n_heads=8, mamba_n_groups=2, mamba_d_state=8, mamba_d_conv=4,
                              layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
                              mamba_expand=2, mamba_chunk_size=8, num_local_experts=0, shared_intermediate_size=64,
                              position_embedding_type="rope")),
    "rwkv": ("RwkvConfig", "RwkvForCausalLM", 1e-6,
             dict(hidden_size=32, num_hidden_layers=2, attention_hidden_size=32, intermediate_size=64, context_length=64)),
    "recurrent_gemma": ("RecurrentGemmaConfig", "RecurrentGemmaForCausalLM", 1e-6,
                        dict(hidden_size=32, lru_width=32, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=3,
                             head_dim=16, intermediate_size=64, block_types=("recurrent", "recurrent", "attention"),
                             attention_window_size=16)),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM", 1e-6,
                   dict(hidden_size=32, num_hidden_layers=4, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=8, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
                        linear_num_value_heads=4, linear_conv_kernel_dim=4, num_experts=0,
                        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"])),
}


def tiny(model_type):
    """A tiny random *ForCausalLM of the model type, and the float64 bound its mixers reach."""
    config_cls, model_cls, bound, kw = TINY[model_type]
    config = getattr(transformers, config_cls)(vocab_size=VOCAB, **kw)
    return getattr(transformers, model_cls)(config), bound


TYPES = sorted(TINY)


def test_every_supported_type_is_tested():
    assert sorted(iattn.hf.supported_model_types()) == TYPES


@pytest.mark.parametrize("model_type", TYPES)
@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_every_mixer_output_equals_its_decomposition(model_type, precision):
    torch.manual_seed(0)
    model, bound64 = tiny(model_type)
    model = (model.double() if precision == "float64" else model.float()).eval()
    ids = torch.randint(0, VOCAB, (BATCH, L))
    ex = iattn.hf.explain(model, input_ids=ids, progress=False)
    assert ex.model_type == model_type
    mixer_layers = {layer.index for layer in ex.layers if layer.kind != "attention"}
    assert mixer_layers, "no mixer layer was found"
    bound = bound64 if precision == "float64" else 2e-5
    for layer in ex.layers:
        err = layer.relative_error()
        if np.isnan(err):  # an attention layer that cannot be rebuilt from v_proj / o_proj (zamba2's adapters)
            assert layer.kind == "attention" and model_type == "zamba2"
            continue
        assert err <= bound, f"layer {layer.index} ({layer.kind}): relative error {err:.3e} > {bound:.0e}"
        maps = layer.maps()
        assert maps.ndim == 4 and maps.shape[0] == BATCH and maps.shape[2:] == (L, L)
        assert maps.dtype == np.dtype(precision)
        assert np.abs(np.triu(maps[0, 0], 1)).max() == 0  # causal
        if layer.decompositions is not None:
            assert len(layer.decompositions) == BATCH
            d = layer.decompositions[1]
            np.testing.assert_array_equal(d.x.shape[0], L)
    assert ex.max_relative_error() <= bound
    roll = ex.rollout(1)
    assert roll.shape == (L, L)
    np.testing.assert_allclose(roll.sum(axis=1), 1, rtol=1e-4)
    att = ex.attribution(0, query=-1)
    assert att.shape == (L, L) and np.isfinite(att).all()


def test_mamba2_heads_are_the_mixers_heads():
    torch.manual_seed(1)
    model, _ = tiny("mamba2")
    ex = iattn.hf.explain(model.double().eval(), input_ids=torch.randint(0, VOCAB, (1, L)), progress=False)
    m = ex.layers[0].maps(abs=False)
    assert m.shape == (1, 4, L, L)
    d = ex.layers[0].decompositions[0]
    P = d.x.shape[1] // 4
    np.testing.assert_allclose(m[0, 2], d.mean(channels=(2 * P, 3 * P)), rtol=1e-12, atol=1e-14)


def test_attention_layers_are_the_models_own_probabilities():
    torch.manual_seed(2)
    model, _ = tiny("recurrent_gemma")
    ex = iattn.hf.explain(model.double().eval(), input_ids=torch.randint(0, VOCAB, (BATCH, L)), progress=False)
    att = ex.layers[2]
    assert att.kind == "attention" and att.decompositions is None
    np.testing.assert_allclose(att.attention.sum(axis=-1), 1, rtol=1e-6)
    assert att.relative_error() <= 1e-12  # o_proj(A v) from the captured probabilities is the layer's output


def test_save_writes_maps_pictures_and_a_page(tmp_path):
    torch.manual_seed(3)
    model, _ = tiny("mamba")
    ex = iattn.hf.explain(model.double().eval(), input_ids=torch.randint(0, VOCAB, (1, 9)), progress=False)
    paths = ex.save(tmp_path)
    names = sorted(os.path.basename(p) for p in paths)
    assert names == sorted(["index.html", "layer00_mamba.npy", "layer00_mamba.png", "layer01_mamba.npy", "layer01_mamba.png",
                            "rollout.npy", "rollout.png"])
    np.testing.assert_array_equal(np.load(tmp_path / "layer01_mamba.npy"), ex.layers[1].maps()[0])
    assert (tmp_path / "rollout.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "layer 1 (mamba, 1 head)" in (tmp_path / "index.html").read_text()


def test_unsupported_models_and_inputs_are_refused():
    cfg = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB)
    with pytest.raises(ValueError, match="model type 'gpt2' is not supported; supported: .*mamba"):
        iattn.hf.explain(transformers.GPT2LMHeadModel(cfg), input_ids=torch.zeros((1, 4), dtype=torch.long))
    model, _ = tiny("mamba")
    with pytest.raises(ValueError, match="padding"):
        iattn.hf.explain(model, input_ids=torch.zeros((1, 4), dtype=torch.long), attention_mask=torch.tensor([[0, 1, 1, 1]]))
    with pytest.raises(TypeError, match="bfloat16; call model.float"):
        iattn.hf.explain(model.to(torch.bfloat16), input_ids=torch.zeros((1, 4), dtype=torch.long))
    cfg = transformers.MambaConfig(hidden_size=16, state_size=4, num_hidden_layers=1, vocab_size=VOCAB, use_bias=True)
    with pytest.raises(ValueError, match="in_proj has a bias"):
        iattn.hf.explain(transformers.MambaForCausalLM(cfg).double(), input_ids=torch.zeros((1, 4), dtype=torch.long))
