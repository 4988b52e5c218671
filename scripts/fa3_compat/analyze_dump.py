"""Recomputes a failed FlashAttention-3 test's gradients in float64 (a dump that
FLASH3_FA3_DUMP=DIR left, conftest.py), exactly and with one rounding to 16 bits at a time, and
prints how far flash3's dq, dk and dv are from each: the rounding whose variant flash3 matches
is the one its kernels make.

    python3 scripts/fa3_compat/analyze_dump.py DIR/<test id>.npz ...

Needs numpy only (no GPU, no torch). Handles FA3's padded layouts (padding masks, bottom-right
windows, causal, softcap, GQA); the dtype is read from the test id (dtype0 bf16, dtype1 fp16).
"""
import sys

import numpy as np


def to_bf16(x):
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # round to nearest even
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def to_fp16(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float64)


# Which quantity is rounded to 16 bits before it is used.
VARIANTS = {
    "exact": (),
    "D from 16-bit O": ("o",),
    "16-bit dS": ("ds",),
    "16-bit P in dS": ("p",),
    "D from 16-bit O, 16-bit dS": ("o", "ds"),
}


def visible(qm, km, window, causal, b):
    """FA3's attention_ref mask of batch b: padding, then a bottom-right window."""
    sq, sk = qm.shape[1], km.shape[1]
    ok = qm[b][:, None] & km[b][None, :]
    left, right = window
    if causal:
        right = 0
    if left >= 0 or right >= 0:
        n_q, n_k = qm[b].sum(), km[b].sum()
        row, col = np.arange(sq)[:, None], np.arange(sk)[None, :]
        if left < 0:
            masked = col > row + n_k - n_q + right
        else:
            masked = (col > np.minimum(row + n_k - n_q + right, n_k)) | (col < row + n_k - n_q - left)
        ok &= ~masked
    return ok


def gradients(z, rnd, rounded):
    q, k, v, g = (z[n].astype(np.float64) for n in ("q_ref", "k_ref", "v_ref", "g"))
    qm, km = z["query_padding_mask"].astype(bool), z["key_padding_mask"].astype(bool)
    window = [int(w) for w in np.atleast_1d(z["window_size"])] if "window_size" in z else [-1, -1]
    causal, softcap = bool(z.get("causal", False)), float(z.get("softcap", 0.0))
    batch, _, heads, d = q.shape
    group = heads // k.shape[2]
    scale = d ** -0.5
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for b in range(batch):
        ok = visible(qm, km, window, causal, b)
        for h in range(heads):
            hk = h // group
            s = scale * q[b, :, h] @ k[b, :, hk].T
            slope = 1.0
            if softcap > 0:
                t = np.tanh(s / softcap)
                s, slope = softcap * t, 1 - t * t
            s = np.where(ok, s, -np.inf)
            m = s.max(1, keepdims=True)
            e = np.where(ok, np.exp(s - np.where(np.isfinite(m), m, 0)), 0)
            total = e.sum(1, keepdims=True)
            p = e / np.where(total > 0, total, 1)
            o = p @ v[b, :, hk]
            dsum = (g[b, :, h] * (rnd(o) if "o" in rounded else o)).sum(1, keepdims=True)
            dp = g[b, :, h] @ v[b, :, hk].T
            ds = (rnd(p * slope) if "p" in rounded else p * slope) * (dp - dsum)
            ds = np.where(ok, rnd(ds) if "ds" in rounded else ds, 0)
            dq[b, :, h] = scale * ds @ k[b, :, hk]
            dk[b, :, hk] += scale * ds.T @ q[b, :, h]
            dv[b, :, hk] += p.T @ g[b, :, h]
    return dq, dk, dv


def analyze(path):
    z = dict(np.load(path))
    rnd = to_fp16 if "dtype1" in path else to_bf16
    print(path)
    results = {name: gradients(z, rnd, rounded) for name, rounded in VARIANTS.items()}
    for i, name in enumerate(("dq", "dk", "dv")):
        ours, ref, pt = z[name], z[name + "_ref"], z[name + "_pt"]
        print(f"  {name}: flash3 - FA3's reference {np.abs(ours - ref).max():.3e}, "
              f"PyTorch's 16-bit - reference {np.abs(pt - ref).max():.3e}")
        for variant, grads in results.items():
            print(f"    flash3 - float64 with {variant:28s} {np.abs(ours - grads[i]).max():.3e}")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        analyze(p)
