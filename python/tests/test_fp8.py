"""The FP8 paths of the Python API: flash_attn_func on float8_e4m3fn inputs with
FlashAttention-3's per-head descales, and flash_attn_fp8_func (quantization inside).

Tolerance: the reference is exact attention on the values the kernel received (codes
times descales); flash3 may be off from it by at most twice what rounding P to e4m3
costs (attention_e4m3_p), plus two roundings of the bfloat16 output.
"""
import pytest

torch = pytest.importorskip("torch")

from flash3 import flash_attn_fp8_func, flash_attn_func  # noqa: E402

from test_flash3 import attention, requires_hopper  # noqa: E402

E4M3_MAX = 448.0
# batch, seqlen_q, seqlen_k, heads, heads_k, headdim
SHAPES = [(2, 128, 128, 4, 4, 128), (1, 300, 777, 4, 2, 256), (1, 777, 300, 8, 1, 128),
          (2, 500, 500, 4, 2, 64)]


def per_head_quantize(x, group=1):
    """e4m3 codes and (batch, heads / group) float32 descales: one scale per group of
    `group` consecutive heads (q's heads that share a kv head, as FA3's q_descale)."""
    batch, seqlen, heads, headdim = x.shape
    grouped = x.float().reshape(batch, seqlen, heads // group, group * headdim)
    scale = grouped.abs().amax(dim=(1, 3)).clamp_min(1e-12) / E4M3_MAX  # (batch, heads / group)
    codes = (grouped / scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return codes.reshape(x.shape), scale


def dequantize(codes, scale):
    group = codes.shape[2] // scale.shape[1]
    return codes.double() * scale.double().repeat_interleave(group, 1)[:, None, :, None]


def attention_e4m3_p(q, k, v, causal):
    """float64 attention whose probabilities are rounded to e4m3 as the kernel rounds
    them (P = exp(s - max) * 2^8, normalised by the unrounded sum): the error FP8 costs."""
    k, v = (x.repeat_interleave(q.shape[2] // k.shape[2], dim=2) for x in (k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    if causal:
        seqlen_q, seqlen_k = q.shape[1], k.shape[1]
        row = torch.arange(seqlen_q, device=q.device)[:, None]
        col = torch.arange(seqlen_k, device=q.device)[None, :]
        scores = scores.masked_fill(col > row + seqlen_k - seqlen_q, float("-inf"))
    p = torch.exp(scores - scores.amax(dim=-1, keepdim=True)).nan_to_num(0.0) * 256
    p8 = p.float().to(torch.float8_e4m3fn).double()
    out = torch.einsum("bhqk,bkhd->bqhd", p8, v) / p.sum(dim=-1).clamp_min(1e-300).transpose(1, 2)[..., None]
    return out


@requires_hopper
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_fp8_inputs_with_descales(shape, causal):
    batch, seqlen_q, seqlen_k, heads, heads_k, headdim = shape
    make = lambda s, h: torch.randn(batch, s, h, headdim, device="cuda")  # noqa: E731
    q8, dq = per_head_quantize(make(seqlen_q, heads), heads // heads_k)
    k8, dk = per_head_quantize(make(seqlen_k, heads_k))
    v8, dv = per_head_quantize(make(seqlen_k, heads_k))
    out, lse = flash_attn_func(q8, k8, v8, causal=causal, q_descale=dq, k_descale=dk,
                               v_descale=dv, return_attn_probs=True)
    assert out.dtype == torch.bfloat16
    q64, k64, v64 = dequantize(q8, dq), dequantize(k8, dk), dequantize(v8, dv)
    ref, ref_lse = attention(q64, k64, v64, causal, torch.float64)
    emulated = attention_e4m3_p(q64, k64, v64, causal)
    rounded = ref.to(torch.bfloat16)
    atol = 2 * (rounded + 0.3 - 0.3 - rounded).abs().max().item()  # two roundings to bf16
    error = (out.double() - ref).abs().max().item()
    emulated_error = (emulated - ref).abs().max().item()
    assert error <= 2 * emulated_error + atol, f"flash3 {error:.3g}, e4m3 P {emulated_error:.3g}"
    # FP8 wgmma accumulates with ~14 significant bits (see test_forward_fp8_gpu.cpp)
    torch.testing.assert_close(lse, ref_lse.float(), atol=2e-3, rtol=1e-4)


@requires_hopper
@pytest.mark.parametrize("block_quant", [True, False])
@pytest.mark.parametrize("incoherent", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp8_func_quantizes_inside(block_quant, incoherent, dtype):
    q, k, v = (torch.randn(2, 500, 4, 128, device="cuda", dtype=dtype) for _ in range(3))
    out = flash_attn_fp8_func(q, k, v, causal=True, block_quant=block_quant,
                              incoherent=incoherent, seed=7)
    assert out.dtype == dtype and out.shape == q.shape
    ref, _ = attention(q, k, v, True, torch.float64)
    rmse = (out.double() - ref).pow(2).mean().sqrt().item()
    assert rmse < 2e-2, rmse


@requires_hopper
def test_fp8_descales_default_to_one():
    q8, k8, v8 = (torch.randn(1, 128, 2, 128, device="cuda").to(torch.float8_e4m3fn) for _ in range(3))
    one = torch.ones(1, 2, device="cuda")
    given = flash_attn_func(q8, k8, v8, q_descale=one, k_descale=one, v_descale=one)
    assert torch.equal(flash_attn_func(q8, k8, v8, q_descale=one, k_descale=one), given)
    assert torch.equal(flash_attn_func(q8, k8, v8), given)
    with pytest.raises(ValueError, match="shape"):
        flash_attn_func(q8, q8, q8, q_descale=one, k_descale=one, v_descale=torch.ones(2, 2, device="cuda"))


@requires_hopper
def test_fp8_head_dim_96_is_unsupported():
    q8 = torch.zeros(1, 128, 2, 96, device="cuda").to(torch.float8_e4m3fn)
    one = torch.ones(1, 2, device="cuda")
    with pytest.raises(NotImplementedError, match="headdim"):
        flash_attn_func(q8, q8, q8, q_descale=one, k_descale=one, v_descale=one)


def test_fp8_func_refuses_fp8_or_float32_inputs():
    x = torch.zeros(1, 16, 1, 128)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        flash_attn_fp8_func(x, x, x)
