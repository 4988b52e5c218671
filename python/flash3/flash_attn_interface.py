"""flash_attn_func with FlashAttention-3's signature (hopper/flash_attn_interface.py).

Checked here: only what libflash3.so cannot see (4-d torch tensors, one CUDA device,
a dtype it has a code for). Everything else (shapes, strides, head dims, dtypes
other than float16/bfloat16, ...) is judged by the library, whose message is raised:
    FLASH3_ERROR_INVALID_ARGUMENT -> ValueError
    FLASH3_ERROR_UNSUPPORTED      -> NotImplementedError (a RuntimeError subclass)
    anything else                 -> RuntimeError
Arguments that flash3 does not implement yet raise NotImplementedError naming them.

Backward: flash_attn_func is differentiable for float16/bfloat16 inputs (flash3_backward,
on the current stream, with its workspace from PyTorch's allocator: CUDA-graph safe);
deterministic=True makes dq, dk and dv bitwise identical from run to run. The FP8 path
has no backward yet (NotImplementedError).

FP8: flash_attn_func takes torch.float8_e4m3fn q, k, v with q_descale, k_descale and
v_descale of shape (batch, heads_k), as FlashAttention-3 does, and returns bfloat16;
flash_attn_fp8_func quantizes bfloat16/float16 inputs itself (block scales, randomized
Hadamard transform) and returns the input dtype.
"""
import ctypes

import torch

from . import _lib

__all__ = ["flash_attn_func", "flash_attn_fp8_func"]

# The FP8 forward's tile of rows: the default block of the quantization scales.
FP8_BLOCK_ROWS = 128

_DTYPES = {
    torch.float16: _lib.DTYPE_FLOAT16,
    torch.bfloat16: _lib.DTYPE_BFLOAT16,
    torch.float32: _lib.DTYPE_FLOAT32,
    torch.float8_e4m3fn: _lib.DTYPE_FLOAT8_E4M3,
}

# FlashAttention-3 arguments flash3 accepts only at these values. pack_gqa and
# deterministic are accepted at any value: the first is a speed hint (ignored); the
# second is passed to the backward (bitwise reproducible gradients) and does not change
# the forward's result.
_SUPPORTED = {
    "qv": lambda x: x is None,
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


def _on_current_stream(call, args, device):
    """A flash3 C call on `device`, ordered on PyTorch's current stream there."""
    with torch.cuda.device(device):
        call(args, torch.cuda.current_stream(device).cuda_stream)


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
    _on_current_stream(_lib.forward, args, q.device)
    return out, softmax_lse


def _c_float_ptr(t):
    return ctypes.cast(t.data_ptr(), ctypes.POINTER(ctypes.c_float))


# flash3 reads every tensor through 16-byte accesses (TMA): stride 1 in the last
# dimension, the others positive multiples of 16 bytes, data 16-byte aligned.
_ALIGNMENT = 16


def _tma_compatible(t):
    element = t.element_size()
    if t.stride(-1) != 1 or t.data_ptr() % _ALIGNMENT != 0:
        return False
    return all(size == 1 or (stride > 0 and stride * element % _ALIGNMENT == 0)
               for size, stride in zip(t.shape[:-1], t.stride()[:-1]))


def _backward(dout, q, k, v, out, softmax_lse, softmax_scale, causal, deterministic,
              dq=None, dk=None, dv=None):
    """One flash3_backward call on q's device and current stream; returns (dq, dk, dv).

    dq, dk, dv (like q, k, v) are allocated unless given; tests pass poisoned ones to see
    that every element is written. The workspace comes from PyTorch's allocator on the
    current stream, so the call is stream-ordered and may be captured into a CUDA graph.
    """
    if not _tma_compatible(dout):
        # Autograd's gradients may be views flash3 cannot read (an expanded scalar for
        # out.sum(), a slice): a dense copy has the layout it wants.
        dout = dout.contiguous()
    if dq is None:
        dq = torch.empty_like(q)  # q's strides if dense, else contiguous: last stride 1
    if dk is None:
        dk = torch.empty_like(k)
    if dv is None:
        dv = torch.empty_like(v)
    args = _lib.BackwardArgs(
        _describe("dout", dout, q),
        *[_describe(name, t, q) for name, t in (("q", q), ("k", k), ("v", v), ("out", out))],
        _c_float_ptr(softmax_lse),
        *[_describe(name, t, q) for name, t in (("dq", dq), ("dk", dk), ("dv", dv))],
        None,
        0,
        0.0 if softmax_scale is None else softmax_scale,
        int(bool(causal)),
        int(bool(deterministic)),
    )
    workspace_bytes = _lib.backward_workspace_size(args)
    # The caching allocator's blocks are 512-byte aligned (flash3 needs 256).
    workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=q.device)
    args.workspace = workspace.data_ptr()
    args.workspace_bytes = workspace_bytes
    _on_current_stream(_lib.backward, args, q.device)
    del workspace  # the stream-ordered allocator keeps it alive until the kernels are done
    return dq, dk, dv


def _fp8_v_layout(v, q):
    """V (e4m3, (batch, seqlen, heads, headdim), on q's device) in the FP8 forward's
    layout (flash3.h)."""
    v_c = _describe("v", v, q)
    batch, seqlen, heads, headdim = v.shape
    group = _lib.FP8_V_KEY_GROUP
    padded = (seqlen + group - 1) // group * group
    buffer = torch.empty(batch * heads * headdim * padded, dtype=torch.uint8, device=v.device)
    layout = _lib.Fp8V(buffer.data_ptr(), batch, seqlen, heads, headdim)
    _on_current_stream(_lib.fp8_v_layout, _lib.Fp8VLayoutArgs(v_c, layout), v.device)
    return layout, buffer


def _forward_fp8(q, k, v, descales, softmax_scale, causal, out_dtype):
    """flash3_forward_fp8 on e4m3 q, k, v; descales: three (tensor, block_rows) in the
    library's layout (float32, (batch, heads, blocks)). Returns (out, softmax_lse)."""
    for name, t in (("k", k), ("v", v)):
        if t.dtype != torch.float8_e4m3fn:
            raise ValueError(f"flash3: q is float8_e4m3fn but {name}.dtype is {t.dtype}; all three must be")
    q_c, k_c = _describe("q", q, q), _describe("k", k, q)
    v_layout, v_buffer = _fp8_v_layout(v, q)
    batch, seqlen_q, heads, _ = q.shape
    out = torch.empty(q.shape, dtype=out_dtype, device=q.device)
    softmax_lse = torch.empty(batch, heads, seqlen_q, dtype=torch.float32, device=q.device)
    c_descales = [_lib.Fp8Descale(t.data_ptr(), rows) for t, rows in descales]
    args = _lib.ForwardFp8Args(
        q_c, k_c, v_layout, _describe("out", out, q), _c_float_ptr(softmax_lse), *c_descales,
        0.0 if softmax_scale is None else softmax_scale, int(causal),
    )
    _on_current_stream(_lib.forward_fp8, args, q.device)
    del v_buffer  # the stream-ordered allocator keeps it alive until the kernel is done
    return out, softmax_lse


def _head_descales(q, k, q_descale, k_descale, v_descale):
    """FlashAttention-3's per-head descales ((batch, heads_k) each) in the library's
    layout: one block per head; q's repeated over the query heads of each kv head."""
    batch, seqlen_q, heads_q, _ = q.shape
    seqlen_k, heads_k = k.shape[1], k.shape[2]
    given = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
    missing = [name for name, t in given.items() if t is None]
    if missing:
        raise ValueError(
            f"flash3: float8_e4m3fn inputs need q_descale, k_descale and v_descale "
            f"(float32, shape (batch, heads_k) = ({batch}, {heads_k})); missing: {', '.join(missing)}"
        )
    for name, t in given.items():
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (batch, heads_k):
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"flash3: {name} must be a tensor of shape (batch, heads_k) = "
                             f"({batch}, {heads_k}), got {shape}")
        if t.device != q.device:
            raise ValueError(f"flash3: {name} is on {t.device}, q on {q.device}")
    if heads_q % heads_k != 0:
        raise ValueError(f"flash3: heads_q = {heads_q} is not a multiple of heads_k = {heads_k}")
    as_blocks = lambda t: t.to(torch.float32).reshape(batch, -1, 1).contiguous()
    q_heads = q_descale.repeat_interleave(heads_q // heads_k, dim=1)
    return [(as_blocks(q_heads), max(seqlen_q, 1)), (as_blocks(k_descale), max(seqlen_k, 1)),
            (as_blocks(v_descale), max(seqlen_k, 1))]


class _FlashAttnFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, causal, descales=None, deterministic=False):
        ctx.fp8 = q.dtype == torch.float8_e4m3fn
        if ctx.fp8:
            out, softmax_lse = _forward_fp8(q, k, v, descales, softmax_scale, causal, torch.bfloat16)
        else:
            out, softmax_lse = _forward(q, k, v, softmax_scale, causal)
            ctx.save_for_backward(q, k, v, out, softmax_lse)
        ctx.softmax_scale = softmax_scale
        ctx.causal = causal
        ctx.deterministic = deterministic
        ctx.mark_non_differentiable(softmax_lse)
        return out, softmax_lse

    @staticmethod
    def backward(ctx, dout, dsoftmax_lse):
        if ctx.fp8:
            raise NotImplementedError("flash3: the FP8 path has no backward yet")
        q, k, v, out, softmax_lse = ctx.saved_tensors
        dq, dk, dv = _backward(dout, q, k, v, out, softmax_lse, ctx.softmax_scale, ctx.causal,
                               ctx.deterministic)
        return dq, dk, dv, None, None, None, None


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

    FP8: q, k, v torch.float8_e4m3fn (head dim 128 or 256) with q_descale, k_descale
    and v_descale, float32 (batch, heads_k): the attention of float(q) * q_descale[b, h]
    etc.; out is bfloat16. V is copied into the layout FP8 tensor cores need (one extra
    pass over V; flash_attn_fp8_func avoids nothing there but the conversion from torch).

    Returns out (like q), or (out, softmax_lse) when return_attn_probs: the natural-log
    log-sum-exp of each row of scores, float32 (batch, heads, seqlen_q), +inf for rows
    that see no key (their output is zero).

    Differentiable for float16/bfloat16: the backward (flash3_backward) gives dq, dk, dv
    shaped and typed like q, k, v (GQA: dk, dv summed over the query heads of each kv
    head; rows that see no key contribute nothing). deterministic=True makes them bitwise
    identical from run to run. The FP8 path's backward raises NotImplementedError.
    """
    given = locals()
    for name, supported in _SUPPORTED.items():
        value = given[name]
        if not supported(value):
            shown = "a tensor" if isinstance(value, torch.Tensor) else repr(value)
            raise NotImplementedError(f"flash3: {name}={shown} is not supported yet")
    if all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, v)) and v.shape[-1] != q.shape[-1]:
        # FlashAttention-3 allows a head dim of v (dv) other than q's; flash3 not yet.
        raise NotImplementedError(f"flash3: v's head dim {v.shape[-1]} differs from q's {q.shape[-1]} "
                                  "(dv != d) and is not supported yet")
    descales = None
    if isinstance(q, torch.Tensor) and q.dtype == torch.float8_e4m3fn:
        descales = _head_descales(q, k, q_descale, k_descale, v_descale)
    elif any(t is not None for t in (q_descale, k_descale, v_descale)):
        raise ValueError("flash3: q_descale, k_descale and v_descale are for float8_e4m3fn inputs only")
    out, softmax_lse = _FlashAttnFunc.apply(q, k, v, softmax_scale, causal, descales, deterministic)
    return (out, softmax_lse) if return_attn_probs else out


def _quantize(x, block_rows, hadamard, seed):
    """flash3_quantize_fp8: (e4m3 codes like x, float32 descales (batch, heads, blocks))."""
    batch, seqlen, heads, _ = x.shape
    x_fp8 = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    blocks = (seqlen + block_rows - 1) // block_rows
    descale = torch.empty(batch, heads, blocks, dtype=torch.float32, device=x.device)
    args = _lib.QuantizeArgs(
        _describe("x", x, x), _describe("x_fp8", x_fp8, x), _c_float_ptr(descale), block_rows,
        int(hadamard), seed,
    )
    _on_current_stream(_lib.quantize_fp8, args, x.device)
    return x_fp8, descale


def flash_attn_fp8_func(q, k, v, causal=False, softmax_scale=None, block_quant=True,
                        incoherent=True, seed=0):
    """Attention through the FP8 forward on bfloat16/float16 q, k, v, quantized here.

    block_quant: one scale per 128 rows of each (batch, head) (the kernel's tile), else
    one per (batch, head) (FlashAttention-3's descale granularity). incoherent: q and k
    first get the same randomized Hadamard transform (seeded by `seed`; head dim 128 or
    256), which leaves q k^T unchanged and spreads outliers before quantization.
    Returns out in the input dtype (batch, seqlen_q, heads, headdim). Forward only.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dtype not in (torch.float16, torch.bfloat16):
            shown = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"flash3: flash_attn_fp8_func takes float16 or bfloat16 {name}, got {shown}")
        if t.dim() != 4:
            raise ValueError(f"flash3: {name} must be 4-d (batch, seqlen, heads, headdim)")
    rows = lambda t: FP8_BLOCK_ROWS if block_quant else max(t.shape[1], 1)
    q8, dq = _quantize(q, rows(q), incoherent, seed)
    k8, dk = _quantize(k, rows(k), incoherent, seed)
    v8, dv = _quantize(v, rows(v), False, 0)
    descales = [(dq, rows(q)), (dk, rows(k)), (dv, rows(v))]
    out, _ = _forward_fp8(q8, k8, v8, descales, softmax_scale, causal, q.dtype)
    return out
