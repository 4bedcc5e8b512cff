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
    # every layer a Mamba-2 mixer beside attention; mup multipliers away from 1 so that a misplaced one shows;
    # the default mamba_rms_norm=False (no norm: SiLU(z) gates the scan); the other norm options in their own test
    "falcon_h1": ("FalconH1Config", "FalconH1ForCausalLM", 1e-6,
                  dict(hidden_size=32, num_hidden_layers=2, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                       mamba_d_ssm=32, mamba_n_heads=4, mamba_n_groups=2, mamba_d_state=8, mamba_d_conv=4, mamba_chunk_size=8,
                       ssm_multipliers=[0.9, 1.3, 0.7, 1.2, 0.8], ssm_in_multiplier=1.5, ssm_out_multiplier=0.6,
                       attention_in_multiplier=1.25, attention_out_multiplier=0.75, key_multiplier=1.1)),
    # chunk_size 8: the first 16 tokens through the chunkwise kernel, the last 3 through the recurrent one; hidden
    # size 128, as the cache sizes its states by qk_dim rounded up to a multiple of 64 (the layer does not round)
    "xlstm": ("xLSTMConfig", "xLSTMForCausalLM", 1e-6,
              dict(hidden_size=128, num_hidden_layers=2, num_heads=4, chunk_size=8, ffn_proj_factor=1.0,
                   ffn_round_up_to_multiple_of=16)),
    # KDA and MLA layers, dense MLPs (no MoE)
    "kimi_linear": ("KimiLinearConfig", "KimiLinearForCausalLM", 1e-6,
                    dict(hidden_size=32, num_hidden_layers=4, intermediate_size=64, num_attention_heads=4, num_key_value_heads=4,
                         kv_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8, linear_head_dim=8,
                         linear_num_heads=4, linear_conv_kernel_dim=4,
                         layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
                         mlp_layer_types=["dense"] * 4, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
}


def _xlstm_data_dependent_gates(model):
    """xLSTM initialises its gate weights to zero (input gate bias -10), which makes both gates the same for every
    token; random gate weights and biases make them data-dependent, so that the test can see a misplaced gate."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for block in model.backbone.blocks:
            for lin in (block.mlstm_layer.igate_preact, block.mlstm_layer.fgate_preact):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) * 0.1)
                lin.bias.copy_(torch.randn(lin.bias.shape, generator=g) + (2.0 if lin is block.mlstm_layer.fgate_preact else 0.0))


PERTURB = {"xlstm": _xlstm_data_dependent_gates}


def tiny(model_type):
    """A tiny random *ForCausalLM of the model type, and the float64 bound its mixers reach."""
    config_cls, model_cls, bound, kw = TINY[model_type]
    config = getattr(transformers, config_cls)(vocab_size=VOCAB, **kw)
    model = getattr(transformers, model_cls)(config)
    if model_type in PERTURB:
        PERTURB[model_type](model)
    return model, bound


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


def _hooked_errors(model, precision, seed=0):
    torch.manual_seed(seed)
    model = (model.double() if precision == "float64" else model.float()).eval()
    ex = iattn.hf.explain(model, input_ids=torch.randint(0, VOCAB, (BATCH, L)), progress=False)
    return ex, {(layer.index, layer.kind): layer.relative_error() for layer in ex.layers}


@pytest.mark.parametrize("precision", ["float64", "float32"])
@pytest.mark.parametrize("options", [dict(mamba_rms_norm=True, mamba_norm_before_gate=False),
                                     dict(mamba_rms_norm=True, mamba_norm_before_gate=True),
                                     dict(mamba_conv_bias=False, projectors_bias=True, time_step_limit=(0.05, float("inf")))])
def test_falcon_h1_mixer_options(options, precision):
    """The gated RMS norm after the gate (iattn.models.mamba2 itself), before it (bound to the scan output), no conv
    bias, an out_proj bias and a dt floor: each mixer's output against out_proj(H x + beta)."""
    config_cls, model_cls, bound64, kw = TINY["falcon_h1"]
    torch.manual_seed(4)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(vocab_size=VOCAB, **dict(kw, **options)))
    with torch.no_grad():  # weights away from their constant initialisation, so that a misplaced norm weight shows
        for layer in model.model.layers:
            if hasattr(layer.mamba.norm, "weight"):
                layer.mamba.norm.weight.uniform_(0.5, 1.5)
            if layer.mamba.out_proj.bias is not None:
                layer.mamba.out_proj.bias.normal_(0, 0.01)
            layer.mamba.D.uniform_(0.5, 1.5)
    ex, errors = _hooked_errors(model, precision)
    bound = bound64 if precision == "float64" else 2e-5
    assert sum(kind == "mamba2" for _, kind in errors) == 2 and sum(kind == "attention" for _, kind in errors) == 2
    for key, err in errors.items():
        assert err <= bound, f"{key}: relative error {err:.3e} > {bound:.0e}"
    if options.get("projectors_bias"):
        # the bias outweighs this tiny mixer's signal, so check the signal alone too: out_proj(H x + beta) without b
        # (in float32 the subtraction's cancellation costs about 1e-5 of the small signal)
        for layer in ex.layers[0::2]:
            b = layer.decompositions[0].out_bias
            assert b.shape == (1, 32) and np.abs(b).max() > 0
            y = layer.mixer_output - b
            err = max(np.abs(d.output() - b - y[i]).max() for i, d in enumerate(layer.decompositions)) / np.abs(y).max()
            assert err <= (bound64 if precision == "float64" else 1e-4), f"layer {layer.index}: {err:.3e}"


def test_falcon_h1_parallel_branches_make_one_stage():
    """Both branches of a falcon_h1 layer are in the explanation (two entries, one index, parallel) and the rollout
    sees one map per layer: each branch's row-normalised map weighted by its share of the layer's output."""
    torch.manual_seed(5)
    model, _ = tiny("falcon_h1")
    # no padding token (id 0: its embedding is zero, so is its row of the mixer's map)
    ex = iattn.hf.explain(model.double().eval(), input_ids=torch.randint(1, VOCAB, (1, L)), progress=False)
    assert [(layer.index, layer.kind, layer.parallel) for layer in ex.layers] == [
        (0, "mamba2", True), (0, "attention", True), (1, "mamba2", True), (1, "attention", True)]
    assert [layer.output_scale for layer in ex.layers[:2]] == [0.6, 0.75]
    maps = ex.layer_maps(0)
    assert len(maps) == 2
    m, a = ex.layers[0], ex.layers[1]
    wm = 0.6 * np.linalg.norm(m.mixer_output[0])
    wa = 0.75 * np.linalg.norm(a.mixer_output[0])
    mm = m.maps()[0].mean(axis=0)
    aa = a.maps()[0].mean(axis=0)
    expected = (wm * mm / mm.sum(axis=1, keepdims=True) + wa * aa / aa.sum(axis=1, keepdims=True)) / (wm + wa)
    np.testing.assert_allclose(maps[0], expected, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(maps[0].sum(axis=1), 1, rtol=1e-12)
    assert ex.rollout().shape == (L, L) and ex.attribution(query=-1).shape == (L, L)
    # the attention branch's probabilities are its own: o_proj(A v) from them is its output
    assert a.relative_error() <= 1e-12


def test_kimi_linear_mla_maps_are_checked():
    torch.manual_seed(6)
    model, _ = tiny("kimi_linear")
    ex = iattn.hf.explain(model.double().eval(), input_ids=torch.randint(0, VOCAB, (BATCH, L)), progress=False)
    assert [layer.kind for layer in ex.layers] == ["kimi_linear", "attention", "kimi_linear", "attention"]
    for layer in ex.layers[1::2]:
        assert layer.reconstruction is not None and layer.relative_error() <= 1e-12  # o_proj(A v), v from kv_b_proj
    assert ex.layers[0].maps().shape == (BATCH, 4, L, L)


def test_xlstm_norm_weight_and_gates():
    """The multi-head layer norm's weight away from 1 and a gate soft cap that bites (2 instead of 15)."""
    config_cls, model_cls, bound64, kw = TINY["xlstm"]
    torch.manual_seed(8)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(vocab_size=VOCAB, **dict(kw, gate_soft_cap=2.0)))
    _xlstm_data_dependent_gates(model)
    with torch.no_grad():
        for block in model.backbone.blocks:
            block.mlstm_layer.multihead_norm.weight.uniform_(0.5, 1.5)
    for precision, bound in (("float64", bound64), ("float32", 2e-5)):
        _, errors = _hooked_errors(model, precision)
        assert len(errors) == 2 and max(errors.values()) <= bound, errors


def test_unsupported_options_of_the_new_types_are_refused():
    config_cls, model_cls, _, kw = TINY["falcon_h1"]
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(vocab_size=VOCAB, **dict(kw, mamba_proj_bias=True)))
    with pytest.raises(ValueError, match="falcon_h1 mamba mixer.in_proj has a bias"):
        iattn.hf.explain(model.double(), input_ids=torch.zeros((1, 4), dtype=torch.long))
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(vocab_size=VOCAB, **dict(kw, time_step_limit=(0.0, 2.0))))
    with pytest.raises(ValueError, match=r"clamps dt to \(0.0, 2.0\); an upper clamp is not supported"):
        iattn.hf.explain(model.double(), input_ids=torch.zeros((1, 4), dtype=torch.long))
    config_cls, model_cls, _, kw = TINY["kimi_linear"]
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(vocab_size=VOCAB, **dict(kw, hidden_act="gelu")))
    with pytest.raises(ValueError, match="kimi_linear mixer's activation is 'gelu'; only silu"):
        iattn.hf.explain(model.double(), input_ids=torch.zeros((1, 4), dtype=torch.long))
    # transformers 5.24 cannot initialise a fused xLSTM (its _init_weights fails), so the fused layout is refused
    model, _ = tiny("xlstm")
    model.config.weight_mode = "fused"  # the layers read the shared config
    with pytest.raises(ValueError, match="xlstm weight_mode 'fused' is not supported; supported: single"):
        iattn.hf.explain(model.double(), input_ids=torch.zeros((1, 4), dtype=torch.long))
