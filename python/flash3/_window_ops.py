"""The varlen forward and backward with the sliding window given as a tensor.

FlashAttention-3's tests pass window_size as a 2-element int tensor; read with int() inside
flash_attn_varlen_func, it has no value while torch traces the call with fake tensors
(torch.compile, AOT autograd, opcheck's autograd check: DataDependentOutputException). These
two operators take the window as a CPU tensor and read it only where they run: their fake
implementations need no window (it changes no shape), and their real ones pass its two ints to
torch.ops.flash3.fwd_varlen / bwd_varlen.
"""
from typing import Optional

import torch

from ._ops import ops


def _sides(window):
    if window.device.type != "cpu" or window.numel() != 2:
        raise ValueError(f"flash3: a window_size tensor holds (left, right) on the CPU, "
                         f"got {tuple(window.shape)} on {window.device}")
    left, right = (int(x) for x in window.tolist())
    return left, right


@torch.library.custom_op("flash3_window::fwd_varlen", mutates_args=())
def fwd_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
               cu_seqlens_k: torch.Tensor, max_seqlen_q: int, softmax_scale: Optional[float],
               causal: bool, seqused_q: Optional[torch.Tensor], seqused_k: Optional[torch.Tensor],
               deterministic: bool, window: torch.Tensor, attention_chunk: int,
               softcap: float) -> tuple[torch.Tensor, torch.Tensor]:
    left, right = _sides(window)
    with torch.no_grad():
        return ops.fwd_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale,
                              causal, seqused_q, seqused_k, deterministic, left, right,
                              attention_chunk, softcap)


@fwd_varlen.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, causal, seqused_q,
      seqused_k, deterministic, window, attention_chunk, softcap):
    return ops.fwd_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale,
                          causal, seqused_q, seqused_k, deterministic, -1, -1, attention_chunk,
                          softcap)


@torch.library.custom_op("flash3_window::bwd_varlen", mutates_args=())
def bwd_varlen(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               out: torch.Tensor, softmax_lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
               cu_seqlens_k: torch.Tensor, max_seqlen_q: int, softmax_scale: Optional[float],
               causal: bool, deterministic: bool, seqused_q: Optional[torch.Tensor],
               seqused_k: Optional[torch.Tensor], window: torch.Tensor, attention_chunk: int,
               softcap: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    left, right = _sides(window)
    return ops.bwd_varlen(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k,
                          max_seqlen_q, softmax_scale, causal, deterministic, seqused_q,
                          seqused_k, left, right, attention_chunk, softcap)


@bwd_varlen.register_fake
def _(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale,
      causal, deterministic, seqused_q, seqused_k, window, attention_chunk, softcap):
    return ops.bwd_varlen(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k,
                          max_seqlen_q, softmax_scale, causal, deterministic, seqused_q,
                          seqused_k, -1, -1, attention_chunk, softcap)


def _setup_context(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, causal, seqused_q,
     seqused_k, deterministic, window, attention_chunk, softcap) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
                          window)
    ctx.options = (max_seqlen_q, softmax_scale, causal, deterministic, attention_chunk, softcap)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse, cu_q, cu_k, seqused_q, seqused_k, window = ctx.saved_tensors
    max_seqlen_q, softmax_scale, causal, deterministic, chunk, softcap = ctx.options
    dq, dk, dv = bwd_varlen(dout.contiguous(), q, k, v, out, lse, cu_q, cu_k, max_seqlen_q,
                            softmax_scale, causal, deterministic, seqused_q, seqused_k, window,
                            chunk, softcap)
    return (dq, dk, dv) + (None,) * 11


fwd_varlen.register_autograd(_backward, setup_context=_setup_context)
