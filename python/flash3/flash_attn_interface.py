"""flash_attn_func with FlashAttention-3's signature (hopper/flash_attn_interface.py).

Checked here: only what libflash3.so cannot see (4-d torch tensors, one CUDA device,
a dtype it has a code for). Everything else (shapes, strides, head dims, dtypes
other than float16/bfloat16, ...) is judged by the library, whose message is raised:
    FLASH3_ERROR_INVALID_ARGUMENT -> ValueError
    FLASH3_ERROR_UNSUPPORTED      -> NotImplementedError (a RuntimeError subclass)
    anything else                 -> RuntimeError
Arguments that flash3 does not implement yet raise NotImplementedError naming them.
"""
import ctypes

import torch

from . import _lib

__all__ = ["flash_attn_func"]

_DTYPES = {
    torch.float16: _lib.DTYPE_FLOAT16,
    torch.bfloat16: _lib.DTYPE_BFLOAT16,
    torch.float32: _lib.DTYPE_FLOAT32,
    torch.float8_e4m3fn: _lib.DTYPE_FLOAT8_E4M3,
}

# FlashAttention-3 arguments flash3 accepts only at these values. pack_gqa and
# deterministic are accepted at any value: the first is a speed hint and the second
# concerns the backward, and neither changes the forward's result.
_SUPPORTED = {
    "qv": lambda x: x is None,
    "q_descale": lambda x: x is None,
    "k_descale": lambda x: x is None,
    "v_descale": lambda x: x is None,
    "window_size": lambda x: tuple(x) in ((-1, -1), (None, None)),
    "attention_chunk": lambda x: x == 0,
    "softcap": lambda x: x == 0.0,
    "num_splits": lambda x: x in (0, 1),  # 0: "choose for me"; flash3 never splits
    "sm_margin": lambda x: x == 0,
    "softmax_scale": lambda x: x != 0.0,  # the C ABI reads 0 as 1/sqrt(headdim)
}


def _describe(name, t, q):
    """The flash3_tensor for `t`, after the checks the library cannot make."""
    if not isinstance(t, torch.Tensor) or t.dim() != 4:
        raise ValueError(f"flash3: {name} must be a 4-d torch.Tensor (batch, seqlen, heads, headdim)")
    if not t.is_cuda or t.device != q.device:
        raise ValueError(f"flash3: {name} is on {t.device}; q, k and v must be on one CUDA device")
    if t.dtype not in _DTYPES:
        raise ValueError(f"flash3: {name}.dtype is {t.dtype}; use torch.float16 or torch.bfloat16")
    return _lib.Tensor(t.data_ptr(), _DTYPES[t.dtype], tuple(t.shape), t.stride())


def _forward(q, k, v, softmax_scale, causal, out=None, softmax_lse=None):
    """One flash3_forward call on q's device and current stream; returns (out, softmax_lse).

    out (like q) and softmax_lse (float32, contiguous (batch, heads, seqlen_q)) are
    allocated unless given; tests pass poisoned ones to see that every element is written.
    """
    inputs = [_describe(name, t, q) for name, t in (("q", q), ("k", k), ("v", v))]
    batch, seqlen_q, heads, _ = q.shape
    if out is None:
        out = torch.empty_like(q)
    if softmax_lse is None:
        softmax_lse = torch.empty(batch, heads, seqlen_q, dtype=torch.float32, device=q.device)
    args = _lib.ForwardArgs(
        *inputs,
        _describe("out", out, q),
        ctypes.cast(softmax_lse.data_ptr(), ctypes.POINTER(ctypes.c_float)),
        0.0 if softmax_scale is None else softmax_scale,
        int(causal),
    )
    with torch.cuda.device(q.device):
        _lib.forward(args, torch.cuda.current_stream(q.device).cuda_stream)
    return out, softmax_lse


class _FlashAttnFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, causal):
        out, softmax_lse = _forward(q, k, v, softmax_scale, causal)
        ctx.mark_non_differentiable(softmax_lse)
        return out, softmax_lse

    @staticmethod
    def backward(ctx, dout, dsoftmax_lse):
        raise NotImplementedError("flash3: backward is not implemented yet")


def flash_attn_func(
    q,
    k,
    v,
    softmax_scale=None,
    causal=False,
    qv=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    sm_margin=0,
    return_attn_probs=False,
):
    """Exact attention: softmax(softmax_scale * q k^T [causal mask]) v, per head.

    q: (batch, seqlen_q, heads, headdim); k, v: (batch, seqlen_k, heads_k, headdim) with
    heads % heads_k == 0 (GQA/MQA); float16 or bfloat16 on one Hopper GPU, last dim
    contiguous. softmax_scale defaults to 1/sqrt(headdim). causal aligns the mask to the
    bottom-right corner: query i sees keys j <= i + seqlen_k - seqlen_q.

    Returns out (like q), or (out, softmax_lse) when return_attn_probs: the natural-log
    log-sum-exp of each row of scores, float32 (batch, heads, seqlen_q), +inf for rows
    that see no key (their output is zero). Backward raises NotImplementedError.
    """
    given = locals()
    for name, supported in _SUPPORTED.items():
        value = given[name]
        if not supported(value):
            shown = "a tensor" if isinstance(value, torch.Tensor) else repr(value)
            raise NotImplementedError(f"flash3: {name}={shown} is not supported yet")
    out, softmax_lse = _FlashAttnFunc.apply(q, k, v, softmax_scale, causal)
    return (out, softmax_lse) if return_attn_probs else out
