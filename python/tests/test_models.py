"""Every model's decomposition against its own plain recurrent forward (the C++ oracle, in double):
output() == out_proj(H x + beta) == forward(u), per-channel matrices against apply, causality,
and the errors a wrong weights dict gets."""
import numpy as np
import pytest

import iattn

# vision_mamba (bidirectional, not causal; nested activations) has its own tests below
MODELS = sorted(name for name in dir(iattn.models) if not name.startswith("_") and name != "vision_mamba")
RNG = np.random.default_rng(3)


def test_the_models_are_all_there():
    assert set(MODELS) | {"vision_mamba"} == {
        "mamba", "mamba2", "griffin", "retnet", "rwkv4", "gla", "hgrn", "qwen3_next", "deltanet", "rwkv7", "hgrn2", "rwkv6",
        "linear_attention", "mlstm", "s4d", "hyena", "transformer", "deltaproduct", "kimi_linear", "lru", "mamba3",
        "vision_mamba"}  # the 22 C++ models
    assert "vision_mamba" in dir(iattn.models)


def d_model_of(name, w):
    for key in ("d_model", "hidden_size", "width", "embed_dim", "embedding_dim"):
        if key in w.config:
            return w.config[key]
    raise KeyError(f"{name}: no model width in {w.config}")


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("dtype,tol", [("float64", 1e-10), ("float32", 2e-4)])
def test_decomposition_equals_the_forward(name, dtype, tol):
    model = getattr(iattn.models, name)
    w = model.init(seed=11, dtype=dtype)
    L = 37
    u = RNG.standard_normal((L, d_model_of(name, w))).astype(dtype)
    y = model.forward(w, u)
    d = model.decompose(w, u)
    assert d.dtype == dtype and y.dtype == np.dtype(dtype)
    scale = 1 + np.abs(y).max()
    assert np.abs(d.output() - y).max() <= tol * scale
    Hx = d.apply(d.x)
    D = d.x.shape[1]
    for c in (0, D // 2, D - 1):
        M = d.materialize(c)
        np.testing.assert_allclose(M @ d.x[:, c], Hx[:, c], rtol=0, atol=tol * (1 + np.abs(Hx).max()) * 10)
        assert np.abs(np.triu(M, 1)).max() == 0.0
    m = d.mean(abs=True)
    assert m.shape == (L, L) and (m >= 0).all()


def test_weights_errors_name_the_field():
    w = iattn.models.mamba.init(seed=0, d_model=8, d_state=4)
    u = np.zeros((5, 8))
    bad = iattn.Weights(w, w.config)
    bad["A_log"] = np.zeros((3, 3))
    with pytest.raises(ValueError, match=r"A_log has shape \(3, 3\) but expected \(d_inner=16, d_state=4\)"):
        iattn.models.mamba.decompose(bad, u)
    missing = iattn.Weights({k: v for k, v in w.items() if k != "D"}, w.config)
    with pytest.raises(ValueError, match="weights is missing D"):
        iattn.models.mamba.forward(missing, u)
    extra = iattn.Weights(dict(w, bias=np.zeros((1, 1))), w.config)
    with pytest.raises(ValueError, match="unknown field 'bias'"):
        iattn.models.mamba.decompose(extra, u)
    with pytest.raises(TypeError, match="unknown config field 'd_modle'"):
        iattn.models.mamba.init(d_modle=8)
    with pytest.raises(TypeError, match="no config"):
        iattn.models.mamba.decompose(dict(w), u)
    with pytest.raises(ValueError, match=r"u has shape \(5, 7\) but expected \(L, d_model=8\)"):
        iattn.models.mamba.decompose(w, np.zeros((5, 7)))
    mixed = iattn.Weights(dict(w, D=w["D"].astype(np.float32)), w.config)
    with pytest.raises(TypeError, match=r"weights\['D'\] is float32"):
        iattn.models.mamba.decompose(mixed, u)
    # config= overrides the weights' own
    y = iattn.models.mamba.forward(dict(w), u, config=w.config)
    assert y.shape == (5, 8)


def test_config_reports_defaults_and_overrides():
    c = iattn.models.mamba2.config(d_model=32)
    assert c["d_model"] == 32 and c["headdim"] == 32 and c["eps"] == pytest.approx(1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_attention_from_activations_equals_decompose(name):
    model = getattr(iattn.models, name)
    w = model.init(seed=5)
    u = RNG.standard_normal((23, d_model_of(name, w)))
    acts = model.activations(w, u)
    a = model.attention(acts)
    d = model.decompose(w, u)
    np.testing.assert_array_equal(a.output(), d.output())
    np.testing.assert_array_equal(a.mean(), d.mean())
    # a hook's tensors in float32 give the float32 decomposition
    acts32 = {k: (v.astype(np.float32) if isinstance(v, np.ndarray) else v) for k, v in acts.items()}
    a32 = model.attention(acts32)
    assert a32.dtype == "float32"
    y = model.forward(w, u)
    assert np.abs(a32.output() - y).max() <= 1e-3 * (1 + np.abs(y).max())
    with pytest.raises(ValueError, match="unknown field 'nonsense'"):
        model.attention(dict(acts, nonsense=np.zeros((1, 1))))


def test_activations_without_out_proj_stop_before_it():
    w = iattn.models.mamba.init(seed=2, d_model=8, d_state=4)
    u = RNG.standard_normal((9, 8))
    acts = iattn.models.mamba.activations(w, u)
    del acts["out_proj_weight"]
    d = iattn.models.mamba.attention(acts)
    assert d.out_weight.shape == (0, 0)
    full = iattn.models.mamba.decompose(w, u)
    np.testing.assert_allclose(d.output() @ w["out_proj_weight"].T, full.output(), rtol=1e-12, atol=1e-14)
    bad = dict(acts, A=np.abs(acts["A"]))
    with pytest.raises(ValueError, match="A must be <= 0"):
        iattn.models.mamba.attention(bad)


def test_paper_variants_match_their_formulas():
    w = iattn.models.mamba.init(seed=4, d_model=8, d_state=4)
    L = 11
    a = iattn.models.mamba.activations(w, RNG.standard_normal((L, 8)))
    delta, A, B, C = a["delta"], a["A"], a["B"], a["C"]
    s6 = iattn.models.mamba.s6_attention(a)
    hol = iattn.models.mamba.holistic_attention(a)
    sig = lambda v: 1 / (1 + np.exp(-v))
    K = a["conv1d_weight"].shape[1]
    for c in (0, 9):
        S = np.zeros((L, L))
        for t in range(L):
            for s in range(t + 1):
                S[t, s] = np.sum(C[t] * np.exp(delta[s + 1:t + 1, c].sum() * A[c]) * B[s]) * delta[s, c]
        np.testing.assert_allclose(s6.materialize(c), S, rtol=1e-10, atol=1e-12)
        # eq. 9: diag(SiLU z) S6 diag(sigmoid p) M, with p the conv output (bias included) and M the conv
        M = np.zeros((L, L))
        for t in range(L):
            for k in range(K):
                if t - K + 1 + k >= 0:
                    M[t, t - K + 1 + k] = a["conv1d_weight"][c, k]
        p = M @ a["x"][:, c] + a["conv1d_bias"][0, c]
        z = a["z"][:, c]
        ref = np.diag(z * sig(z)) @ S @ np.diag(sig(p)) @ M
        np.testing.assert_allclose(hol.materialize(c), ref, rtol=1e-10, atol=1e-12)
    d = iattn.models.mamba.attention(a)
    assert np.abs(d.materialize(0) - hol.materialize(0)).max() > 1e-6  # the exact matrix keeps D and more
    w2 = iattn.models.mamba2.init(seed=4)
    a2 = iattn.models.mamba2.activations(w2, RNG.standard_normal((L, 64)))
    P = iattn.models.mamba2.paper_attention(a2)
    assert P.head_dim == w2.config["headdim"] and P.causal


# ---- vision_mamba: two Mamba scans, one over the reversed tokens; weights named as Vim's state_dict -------------

VIM_BACKWARD = ["conv1d_b_weight", "conv1d_b_bias", "x_proj_b_weight", "dt_proj_b_weight", "dt_proj_b_bias", "A_b_log", "D_b"]


@pytest.mark.parametrize("dtype,tol", [("float64", 1e-10), ("float32", 1e-4)])
@pytest.mark.parametrize("if_devide_out", [True, False])
def test_vision_mamba_decomposition_equals_the_forward(dtype, tol, if_devide_out):
    vm = iattn.models.vision_mamba
    w = vm.init(seed=11, dtype=dtype, d_model=16, d_state=4, if_devide_out=if_devide_out)
    assert sorted(w) == sorted(["in_proj_weight", "conv1d_weight", "conv1d_bias", "x_proj_weight", "dt_proj_weight", "dt_proj_bias",
                                "A_log", "D", "out_proj_weight"] + VIM_BACKWARD)
    assert w.config == dict(d_model=16, d_state=4, d_conv=4, expand=2, dt_rank=0, if_devide_out=if_devide_out)
    L = 21
    u = RNG.standard_normal((L, 16)).astype(dtype)
    y = vm.forward(w, u)
    d = vm.decompose(w, u)
    assert d.dtype == dtype and y.dtype == np.dtype(dtype)
    assert np.abs(d.output() - y).max() <= tol * (1 + np.abs(y).max())
    # H = s (H_fwd + flip(H_bwd)): the strictly lower part is the forward scan's, the strictly upper the backward's
    fwd_w = iattn.Weights({k: w[k] for k in ["in_proj_weight", "conv1d_weight", "conv1d_bias", "x_proj_weight", "dt_proj_weight",
                                             "dt_proj_bias", "A_log", "D", "out_proj_weight"]},
                          {k: v for k, v in w.config.items() if k != "if_devide_out"})
    bwd_w = iattn.Weights(dict(fwd_w, **{k.replace("_b", "", 1) if k != "A_b_log" else "A_log": w[k] for k in VIM_BACKWARD}), fwd_w.config)
    s = 0.5 if if_devide_out else 1.0
    Hf = iattn.models.mamba.decompose(fwd_w, u)
    Hb = iattn.models.mamba.decompose(bwd_w, u[::-1].copy())
    for c in (0, 17, 31):
        M = d.materialize(c)
        ref = s * (Hf.materialize(c) + Hb.materialize(c)[::-1, ::-1])
        np.testing.assert_allclose(M, ref, rtol=0, atol=tol * 10 * (1 + np.abs(ref).max()))
        assert np.abs(np.triu(M, 1)).max() > 0 and np.abs(np.tril(M, -1)).max() > 0  # not causal
    assert not d.H.causal


def test_vision_mamba_attention_from_activations_equals_decompose():
    vm = iattn.models.vision_mamba
    w = vm.init(seed=5, d_model=16, d_state=4)
    u = RNG.standard_normal((13, 16))
    acts = vm.activations(w, u)
    assert sorted(acts) == ["bwd", "fwd", "if_devide_out", "out_proj_weight"]
    np.testing.assert_array_equal(acts["bwd"]["x"], acts["fwd"]["x"][::-1])  # the backward scan reads the reversed tokens
    assert acts["fwd"]["out_proj_weight"].shape == (0, 0)  # shared, at the top level
    a = vm.attention(acts)
    d = vm.decompose(w, u)
    np.testing.assert_array_equal(a.output(), d.output())
    np.testing.assert_array_equal(a.mean(), d.mean())
    # each branch's dict is a Mamba activations dict
    f = iattn.models.mamba.attention(acts["fwd"])
    np.testing.assert_allclose(f.apply(f.x), iattn.models.mamba.attention(dict(acts["fwd"], out_proj_weight=w["out_proj_weight"])).apply(f.x))
    # float32 activations give the float32 decomposition
    to32 = lambda dct: {k: (v.astype(np.float32) if isinstance(v, np.ndarray) else v) for k, v in dct.items()}
    a32 = vm.attention(dict(to32(acts), fwd=to32(acts["fwd"]), bwd=to32(acts["bwd"])))
    assert a32.dtype == "float32"
    y = vm.forward(w, u)
    assert np.abs(a32.output() - y).max() <= 1e-4 * (1 + np.abs(y).max())
    # without out_proj_weight: the inner output
    inner = vm.attention({k: v for k, v in acts.items() if k != "out_proj_weight"})
    np.testing.assert_allclose(inner.output() @ w["out_proj_weight"].T, d.output(), rtol=1e-12, atol=1e-12)


def test_vision_mamba_errors_name_the_field():
    vm = iattn.models.vision_mamba
    w = vm.init(seed=0, d_model=8, d_state=4)
    u = np.zeros((5, 8))
    bad = iattn.Weights(dict(w, A_b_log=np.zeros((3, 3))), w.config)
    with pytest.raises(ValueError, match=r"backward branch .*A_log has shape \(3, 3\) but expected \(d_inner=16, d_state=4\)"):
        vm.decompose(bad, u)
    with pytest.raises(ValueError, match="weights is missing D_b"):
        vm.forward(iattn.Weights({k: v for k, v in w.items() if k != "D_b"}, w.config), u)
    with pytest.raises(ValueError, match="unknown field 'fwd_D'"):
        vm.forward(iattn.Weights(dict(w, fwd_D=w["D"]), w.config), u)
    with pytest.raises(TypeError, match="unknown config field 'bimamba'"):
        vm.init(bimamba=True)
    with pytest.raises(TypeError, match=r"weights\['D_b'\] is float32"):
        vm.decompose(iattn.Weights(dict(w, D_b=w["D_b"].astype(np.float32)), w.config), u)
    acts = vm.activations(w, u)
    with pytest.raises(ValueError, match="acts is missing 'bwd'"):
        vm.attention({k: v for k, v in acts.items() if k != "bwd"})
    with pytest.raises(ValueError, match="unknown field 'nonsense'"):
        vm.attention(dict(acts, nonsense=1))
    with pytest.raises(ValueError, match=r"bwd.x has shape \(4, 16\)"):
        vm.attention(dict(acts, bwd=dict(acts["bwd"], x=acts["bwd"]["x"][:4], z=acts["bwd"]["z"][:4], delta=acts["bwd"]["delta"][:4],
                                         B=acts["bwd"]["B"][:4], C=acts["bwd"]["C"][:4])))
