"""scripts/fa3_compat/analyze_dump.py's float64 backward (CPU only: numpy, no GPU, no torch)."""
import importlib.util
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fa3_compat" / "analyze_dump.py"


def load():
    spec = importlib.util.spec_from_file_location("analyze_dump", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dump(rng, softcap, window, causal):
    # FA3's padded layout: 2 sequences, 5 query and 7 key slots, 4 query heads on 2 K/V heads.
    qm = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    km = np.array([[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1]], bool)
    return {"q_ref": rng.standard_normal((2, 5, 4, 8)), "k_ref": rng.standard_normal((2, 7, 2, 8)),
            "v_ref": rng.standard_normal((2, 7, 2, 6)), "g": rng.standard_normal((2, 5, 4, 6)),
            "query_padding_mask": qm, "key_padding_mask": km, "window_size": np.array(window),
            "causal": np.array(causal), "softcap": np.array(softcap)}


def loss(module, z):
    # sum(g * out) of the float64 forward, masked rows contributing nothing.
    q, k, v, g = (z[n] for n in ("q_ref", "k_ref", "v_ref", "g"))
    qm, km = z["query_padding_mask"], z["key_padding_mask"]
    window = [int(w) for w in z["window_size"]]
    total, softcap = 0.0, float(z["softcap"])
    for b in range(q.shape[0]):
        ok = module.visible(qm, km, window, bool(z["causal"]), b)
        for h in range(q.shape[2]):
            s = q[b, :, h] @ k[b, :, h // 2].T / np.sqrt(q.shape[3])
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            s = np.where(ok, s, -np.inf)
            m = s.max(1, keepdims=True)
            e = np.where(ok, np.exp(s - np.where(np.isfinite(m), m, 0)), 0)
            p = e / np.maximum(e.sum(1, keepdims=True), 1e-300)
            total += (g[b, :, h] * (p @ v[b, :, h // 2])).sum()
    return total


@pytest.mark.parametrize("softcap, window, causal", [(0.0, [-1, -1], False), (0.0, [-1, -1], True),
                                                     (0.0, [2, 1], False), (3.0, [1, 0], False)])
def test_exact_gradients_match_finite_differences(softcap, window, causal):
    module = load()
    z = dump(np.random.default_rng(0), softcap, window, causal)
    dq, dk, dv = module.gradients(z, module.to_bf16, ())
    for name, grad in (("q_ref", dq), ("k_ref", dk), ("v_ref", dv)):
        x = z[name]
        numeric = np.zeros_like(x)
        for index in np.ndindex(x.shape):
            saved = x[index]
            x[index] = saved + 1e-6
            up = loss(module, z)
            x[index] = saved - 1e-6
            numeric[index] = (up - loss(module, z)) / 2e-6
            x[index] = saved
        assert np.abs(grad - numeric).max() < 1e-6, name


def test_sixteen_bit_roundings():
    module = load()
    x = np.array([1.0, 1.0 + 2.0 ** -9, 1.0 + 3 * 2.0 ** -9, 3.14159])
    assert list(module.to_bf16(x)) == [1.0, 1.0, 1.0 + 2.0 ** -7, 3.140625]
    assert module.to_fp16(np.array([1.0 + 2.0 ** -12]))[0] == 1.0
