"""The FP8 paths of the Python API: flash_attn_func on float8_e4m3fn inputs with
FlashAttention-3's per-head descales, and flash_attn_fp8_func (quantization inside).

Tolerance: FP8 keeps 3 mantissa bits, so the reference here is exact attention on the
values the kernel received (codes times descales), and flash3 may be off from it by at
most twice what e4m3 rounding of P and of the output costs (FP8_ATOL, measured by the
CPU emulation in reference/fp8.hpp to stay below 2e-2 on these N(0, 1) shapes).
"""
import pytest

torch = pytest.importorskip("torch")

from flash3 import flash_attn_fp8_func, flash_attn_func  # noqa: E402

from test_flash3 import attention, requires_hopper  # noqa: E402

E4M3_MAX = 448.0
FP8_ATOL = 4e-2  # on outputs of magnitude ~0.1-1: twice the emulated worst case
# batch, seqlen_q, seqlen_k, heads, heads_k, headdim
SHAPES = [(2, 128, 128, 4, 4, 128), (1, 300, 777, 4, 2, 256), (1, 777, 300, 8, 1, 128)]


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
    ref, ref_lse = attention(dequantize(q8, dq), dequantize(k8, dk), dequantize(v8, dv), causal,
                             torch.float64)
    assert (out.double() - ref).abs().max().item() <= FP8_ATOL
    torch.testing.assert_close(lse, ref_lse.float(), atol=1e-3, rtol=1e-3)


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
def test_fp8_needs_all_descales():
    q8 = torch.zeros(1, 128, 2, 128, device="cuda").to(torch.float8_e4m3fn)
    one = torch.ones(1, 2, device="cuda")
    with pytest.raises(ValueError, match="v_descale"):
        flash_attn_func(q8, q8, q8, q_descale=one, k_descale=one)
    with pytest.raises(ValueError, match="shape"):
        flash_attn_func(q8, q8, q8, q_descale=one, k_descale=one, v_descale=torch.ones(2, 2, device="cuda"))


@requires_hopper
def test_fp8_head_dim_64_is_unsupported():
    q8 = torch.zeros(1, 128, 2, 64, device="cuda").to(torch.float8_e4m3fn)
    one = torch.ones(1, 2, device="cuda")
    with pytest.raises(NotImplementedError, match="headdim"):
        flash_attn_func(q8, q8, q8, q_descale=one, k_descale=one, v_descale=one)


def test_fp8_func_refuses_fp8_or_float32_inputs():
    x = torch.zeros(1, 16, 1, 128)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        flash_attn_fp8_func(x, x, x)
