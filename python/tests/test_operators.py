"""iattn.Operator against dense per-channel matrices built with plain numpy loops."""
import numpy as np
import pytest

import iattn

RNG = np.random.default_rng(7)
TOL = {np.float32: 2e-4, np.float64: 1e-10}


def close(a, b, dtype):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape
    err = np.abs(a - b).max() if a.size else 0.0
    assert err <= TOL[dtype] * (1 + np.abs(b).max()), f"max abs error {err}"


# ---- dense oracles, one channel -----------------------------------------------------------------

def dense_diag(d, c, L):
    return np.diag(d[:, c] if d.shape[0] == L else np.full(L, d[0, c]))


def dense_conv(w, c, L):
    K = w.shape[0]
    M = np.zeros((L, L))
    for t in range(L):
        for k in range(K):
            s = t - K + 1 + k
            if s >= 0:
                M[t, s] = w[k, c]
    return M


def dense_recurrence(a, b, c):
    L = a.shape[0]
    M = np.zeros((L, L))
    for t in range(L):
        for s in range(t + 1):
            M[t, s] = np.prod(a[s + 1:t + 1, c]) * b[s, c]
    return M


def dense_semiseparable(lam, B, C, heads, head_dim, c):
    """lam (L, heads*N) per state, B, C (L, N) (one group)."""
    L, N = B.shape
    h = c // head_dim
    M = np.zeros((L, L))
    for t in range(L):
        for s in range(t + 1):
            decay = np.exp(lam[s + 1:t + 1, h * N:(h + 1) * N].sum(axis=0))
            M[t, s] = np.sum(C[t] * decay * B[s])
    return M


def dense_apply(mats, x):
    return np.stack([mats[c] @ x[:, c] for c in range(x.shape[1])], axis=1)


@pytest.fixture(params=[np.float32, np.float64], ids=["float32", "float64"])
def dtype(request):
    return request.param


def mamba_like(L, D, N, dtype):
    """diag(g) (S diag(dt) + diag(skip)) diag(sig) conv(w), with its dense matrices."""
    g = RNG.standard_normal((L, D))
    dt = RNG.uniform(0.01, 0.2, (L, D))
    A = -RNG.uniform(0.5, 4, (D, N))
    B, C = RNG.standard_normal((L, N)), RNG.standard_normal((L, N))
    skip = RNG.standard_normal((1, D))
    sig = RNG.uniform(0, 1, (L, D))
    w = RNG.standard_normal((4, D)) * 0.5
    cast = lambda a: a.astype(dtype)
    S = iattn.semiseparable_factored(cast(dt), cast(A), cast(B), cast(C), heads=D)
    H = (iattn.diagonal(cast(g)) * (S * iattn.diagonal(cast(dt)) + iattn.diagonal(cast(skip)))
         * iattn.diagonal(cast(sig)) * iattn.causal_conv(cast(w)))
    lam = np.concatenate([dt[:, c:c + 1] * A[c][None, :] for c in range(D)], axis=1)
    cd = lambda a: cast(a).astype(np.float64)
    mats = [dense_diag(cd(g), c, L) @ (dense_semiseparable(cd(lam), cd(B), cd(C), D, 1, c) @ dense_diag(cd(dt), c, L)
                                       + dense_diag(cd(skip), c, L)) @ dense_diag(cd(sig), c, L) @ dense_conv(cd(w), c, L)
            for c in range(D)]
    return H, mats


@pytest.mark.parametrize("L", [1, 9, 70])
def test_composed_operator_matches_dense_loops(L, dtype):
    D, N = 3, 2
    H, mats = mamba_like(L, D, N, dtype)
    assert H.length == L and H.channels == D and H.causal and H.dtype == np.dtype(dtype).name
    x = RNG.standard_normal((L, D)).astype(dtype)
    y = H.apply(x)
    assert y.dtype == dtype and y.shape == (L, D)
    close(y, dense_apply(mats, x.astype(np.float64)), dtype)
    for c in range(D):
        close(H.materialize(c), mats[c], dtype)
    close(H.mean(), sum(mats) / D, dtype)
    close(H.mean(abs=True), sum(np.abs(m) for m in mats) / D, dtype)
    close(H.mean(channels=(1, 3)), (mats[1] + mats[2]) / 2, dtype)
    close(H.mean(head=2), mats[2], dtype)
    close(H.head_means(), np.stack(mats), dtype)
    close(H.materialize_all(), np.stack(mats), dtype)
    t = L // 2
    close(H.row(t), np.stack([m[t] for m in mats]), dtype)
    close(H.col(t), np.stack([m[:, t] for m in mats]), dtype)
    close(H.block(1, (t, L), (0, t + 1)), mats[1][t:L, 0:t + 1], dtype)


def test_algebra_flip_sum_scale_recurrence(dtype):
    L, D = 12, 2
    a, b = RNG.uniform(0.3, 0.9, (L, D)), RNG.standard_normal((L, D))
    d = RNG.standard_normal((L, D))
    R = iattn.linear_recurrence(a.astype(dtype), b.astype(dtype))
    Dg = iattn.diagonal(d.astype(dtype))
    J = np.eye(L)[::-1]
    ad, bd, dd = (v.astype(dtype).astype(np.float64) for v in (a, b, d))
    for c in range(D):
        Rc, Dc = dense_recurrence(ad, bd, c), np.diag(dd[:, c])
        close((R + Dg).materialize(c), Rc + Dc, dtype)
        close((R - Dg).materialize(c), Rc - Dc, dtype)
        close((2.5 * R).materialize(c), 2.5 * Rc, dtype)
        close((R * 2.5).materialize(c), 2.5 * Rc, dtype)
        close((-R).materialize(c), -Rc, dtype)
        close(R.flip().materialize(c), J @ Rc @ J, dtype)
        close(iattn.flip(R).materialize(c), J @ Rc @ J, dtype)
        close((R.flip() * R).materialize(c), J @ Rc @ J @ Rc, dtype)
        rows = Rc.sum(axis=1, keepdims=True)
        close(R.row_normalize().materialize(c), Rc / rows, dtype)
    assert not R.flip().causal


def test_group_norm_binds_and_apply_computes_statistics():
    L, D, G = 10, 4, 2
    x = RNG.standard_normal((L, D))
    w = RNG.uniform(0.5, 1.5, D)
    N = iattn.group_norm(G, w)
    assert not N.bound
    with pytest.raises(ValueError, match=r"bind\(H, X\) first"):
        N.materialize(0, L=L)
    y = N.apply(x)
    xg = x.reshape(L, G, D // G)
    ref = (xg / np.sqrt((xg ** 2).mean(axis=2, keepdims=True) + 1e-5)).reshape(L, D) * w
    np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)
    Nb = N.bind(x)
    assert Nb.bound
    np.testing.assert_allclose(Nb.apply(x), ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.diag(Nb.materialize(1)), ref[:, 1] / x[:, 1], rtol=1e-12)


def test_errors_name_the_argument_and_shape():
    L, D = 6, 3
    a = RNG.uniform(0.1, 0.9, (L, D))
    R = iattn.linear_recurrence(a, a)
    with pytest.raises(ValueError, match=r"^apply: X has shape \(5, 3\) but expected \(L=6, D=3\)"):
        R.apply(np.zeros((5, 3)))
    with pytest.raises(ValueError, match="^materialize: channel c = 3 is out of range"):
        R.materialize(3)
    with pytest.raises(ValueError, match="the length L"):
        R * iattn.diagonal(np.ones((7, 3)))
    with pytest.raises(TypeError, match="float64 and float32"):
        R * iattn.diagonal(np.ones((6, 3), np.float32))
    with pytest.raises(TypeError, match="float32 or float64"):
        iattn.diagonal(np.ones((6, 3), np.int64))
    with pytest.raises(TypeError, match="x is float32 but the other operands are float64"):
        R.apply(np.zeros((6, 3), np.float32))
    with pytest.raises(ValueError, match="expected a 2-D array"):
        R.apply(np.zeros(6))
    with pytest.raises(ValueError, match="has no heads"):
        R.head_means()
    with pytest.raises(ValueError, match=r"rows = \(4, 9\) is not a range"):
        R.block(0, (4, 9), (0, 2))
    conv = iattn.causal_conv(np.ones((2, 3)))
    assert conv.length is None
    with pytest.raises(ValueError, match="pass it as the last argument"):
        conv.materialize(0)
    np.testing.assert_array_equal(conv.materialize(0, L=3), [[1, 0, 0], [1, 1, 0], [0, 1, 1]])


def test_strided_and_foreign_arrays_are_read():
    L, D = 8, 2
    a = RNG.uniform(0.1, 0.9, (D, L)).T  # Fortran order: copied once into C order
    b = RNG.standard_normal((L, D))
    R = iattn.linear_recurrence(a, b)
    close(R.materialize(1), dense_recurrence(np.ascontiguousarray(a), b, 1), np.float64)

    class Foreign:  # another framework's tensor, read through the DLPack protocol only
        def __init__(self, arr):
            self._arr = arr

        def __dlpack__(self, stream=None, **kwargs):
            return self._arr.__dlpack__()

        def __dlpack_device__(self):
            return self._arr.__dlpack_device__()

    x = RNG.standard_normal((L, D))
    np.testing.assert_array_equal(R.apply(Foreign(x)), R.apply(x))


def test_results_own_their_memory_and_views_are_read_only():
    L, D = 5, 2
    w = iattn.models.mamba.init(seed=0, d_model=4, d_state=2)
    d = iattn.models.mamba.decompose(w, RNG.standard_normal((L, 4)))
    x = d.x
    assert not x.flags.writeable
    del d  # the view keeps the decomposition alive
    assert np.isfinite(x).all() and x.shape == (L, 8)
    y = iattn.linear_recurrence(np.full((L, D), 0.5), np.ones((L, D))).apply(np.ones((L, D)))
    assert y.flags.owndata is False and y.flags.writeable  # numpy wraps the C++ result, no copy
    y[0, 0] = 3.0


def test_decomposition_assembled_from_parts():
    """iattn.Decomposition(H, x, beta, out_weight, out_bias): output() == (H x + beta) W^T + b, the evaluation and the
    explain functions work on it as on a model's, and wrong parts are refused naming the argument."""
    L, D, d = 9, 6, 4
    x = RNG.standard_normal((L, D))
    a = RNG.uniform(0.5, 0.95, (L, D))
    H = iattn.diagonal(RNG.standard_normal((L, D))) * iattn.linear_recurrence(a, np.ones((L, D)))
    beta = RNG.standard_normal((L, D))
    W = RNG.standard_normal((d, D))
    b = RNG.standard_normal(d)
    dec = iattn.Decomposition(H, x, beta, W, b)
    np.testing.assert_allclose(dec.output(), (H.apply(x) + beta) @ W.T + b, rtol=1e-13, atol=1e-13)
    np.testing.assert_array_equal(dec.x, x)
    assert dec.out_bias.shape == (1, d) and dec.dtype == "float64"
    np.testing.assert_array_equal(dec.materialize(2), H.materialize(2))
    g = iattn.explain.frozen_gradient(dec, 5, np.ones((1, d)))
    assert g.shape == (L, D)
    bare = iattn.Decomposition(H, x)  # beta zeros, no projection
    np.testing.assert_allclose(bare.output(), H.apply(x), rtol=1e-14)
    assert bare.out_weight.shape == (0, 0)
    with pytest.raises(ValueError, match=r"Decomposition: x has shape \(9, 5\) but H is an operator of length 9 over 6 channels"):
        iattn.Decomposition(H, x[:, :5])
    with pytest.raises(ValueError, match=r"Decomposition: beta has shape \(8, 6\) but expected \(L=9, D=6\)"):
        iattn.Decomposition(H, x, beta[:8])
    with pytest.raises(ValueError, match=r"Decomposition: out_weight has shape \(4, 5\) but expected \(d_out, D=6\)"):
        iattn.Decomposition(H, x, beta, W[:, :5])
    with pytest.raises(ValueError, match=r"Decomposition: out_bias has shape \(1, 3\) but expected \(d_out=4,\)"):
        iattn.Decomposition(H, x, beta, W, b[:3])
    with pytest.raises(ValueError, match="out_bias is given without out_weight"):
        iattn.Decomposition(H, x, beta, out_bias=b)
    with pytest.raises(TypeError, match="x is float32 but the other operands are float64"):
        iattn.Decomposition(H, x.astype(np.float32))
