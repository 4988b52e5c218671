"""FlashAttention-3's Python interface (hopper/flash_attn_interface.py) over flash3's
PyTorch operators (torch.ops.flash3.*, python/csrc/ops.cpp): switching from FlashAttention-3
is a changed import.

Checked here: only FlashAttention-3 arguments flash3 does not implement yet, which raise
NotImplementedError naming them. Everything else (shapes, strides, head dims, dtypes,
devices) is judged by the library, whose message is raised:
    a bad argument                -> ValueError
    something flash3 lacks        -> NotImplementedError (a RuntimeError subclass)
    anything else                 -> RuntimeError

The operators are registered with PyTorch: torch.compile(fullgraph=True) traces through
them (fake implementations give the outputs' shapes), autograd is registered on
torch.ops.flash3.fwd (its backward is torch.ops.flash3.bwd), and every call runs on the
current CUDA stream with its scratch memory from PyTorch's caching allocator, so CUDA
graph capture works.

Backward: differentiable for float16/bfloat16; deterministic=True makes dq, dk and dv
bitwise identical from run to run. The FP8 path has no backward yet.

FP8: flash_attn_func takes torch.float8_e4m3fn q, k, v with q_descale, k_descale and
v_descale of shape (batch, heads_k), as FlashAttention-3 does (1.0 where not given), and
returns bfloat16; flash_attn_fp8_func quantizes bfloat16/float16 inputs itself (block
scales, randomized Hadamard transform) and returns the input dtype.
"""
import torch

from . import _window_ops
from ._ops import ops

__all__ = [
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "flash_attn_combine",
    "get_scheduler_metadata",
    "flash_attn_fp8_func",
]

# The FP8 forward's tile of rows: the default block of the quantization scales.
FP8_BLOCK_ROWS = 128


def _not_supported(name, value):
    shown = "a tensor" if isinstance(value, torch.Tensor) else repr(value)
    return NotImplementedError(f"flash3: {name}={shown} is not supported yet")


def _refuse_given(*named):
    """NotImplementedError for the first (name, value) given (not None): arguments flash3
    does not take yet."""
    for name, value in named:
        if value is not None:
            raise _not_supported(name, value)


def _window(window_size):
    """FlashAttention-3's window_size (left, right) as two ints, -1 (or None) for an unbounded
    side; its entries may be 0-d tensors, as FA3's tests pass them."""
    left, right = window_size
    return (-1 if left is None else int(left)), (-1 if right is None else int(right))


def _window_tensor(window_size):
    """window_size as one int64 CPU tensor (left, right) when it is a tensor or holds tensors
    (FlashAttention-3's tests pass torch.randint(0, seqlen_k, (2,))), else None."""
    if isinstance(window_size, torch.Tensor):
        return window_size.to(device="cpu", dtype=torch.int64).reshape(2)
    if any(isinstance(side, torch.Tensor) for side in window_size):
        return torch.stack([torch.as_tensor(-1 if side is None else side).to("cpu", torch.int64).reshape(())
                            for side in window_size])
    return None


def _refuse_unsupported(qv, num_splits, sm_margin, softmax_scale):
    """FlashAttention-3 arguments flash3 accepts only at their defaults. (pack_gqa and
    num_splits, speed hints that do not change the result, are accepted and ignored:
    flash3 packs GQA heads and splits the keys over the SMs where its planner finds it
    pays.)"""
    if qv is not None:
        raise _not_supported("qv", qv)
    if sm_margin != 0:
        raise _not_supported("sm_margin", sm_margin)
    if softmax_scale == 0.0:  # flash3 reads 0 as 1/sqrt(headdim)
        raise _not_supported("softmax_scale", softmax_scale)


def _forward(q, k, v, softmax_scale, causal, out=None, softmax_lse=None):
    """(out, softmax_lse) of the 16-bit forward, into out and softmax_lse when given (tests
    poison them first to see that every element is written)."""
    if out is None and softmax_lse is None:
        return ops.fwd(q, k, v, softmax_scale, causal)
    if out is None:
        out = q.new_empty(*q.shape[:-1], v.shape[-1])
    if softmax_lse is None:
        softmax_lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32, device=q.device)
    ops.fwd_out(q, k, v, out, softmax_lse, softmax_scale, causal)
    return out, softmax_lse


def _backward(dout, q, k, v, out, softmax_lse, softmax_scale, causal, deterministic,
              dq=None, dk=None, dv=None):
    """(dq, dk, dv) of the 16-bit backward, into dq, dk, dv when all three are given."""
    if dq is None or dk is None or dv is None:
        return ops.bwd(dout, q, k, v, out, softmax_lse, softmax_scale, causal, deterministic)
    ops.bwd_out(dout, q, k, v, out, softmax_lse, dq, dk, dv, softmax_scale, causal, deterministic)
    return dq, dk, dv


def _head_descales(q, k, q_descale, k_descale, v_descale):
    """FlashAttention-3's per-head descales ((batch, heads_k) each; 1.0 where None) as
    (tensor, block_rows) in the library's layout (float32, (batch, heads, blocks)): one
    block per head; q's repeated over the query heads of each kv head."""
    batch, seqlen_q, heads_q, _ = q.shape
    seqlen_k, heads_k = k.shape[1], k.shape[2]
    if heads_k == 0 or heads_q % heads_k != 0:
        raise ValueError(f"flash3: heads_q = {heads_q} is not a multiple of heads_k = {heads_k}")
    given = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
    for name, t in given.items():
        if t is None:
            given[name] = torch.ones(batch, heads_k, dtype=torch.float32, device=q.device)
        elif not isinstance(t, torch.Tensor) or tuple(t.shape) != (batch, heads_k):
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"flash3: {name} must be a tensor of shape (batch, heads_k) = "
                             f"({batch}, {heads_k}), got {shape}")
        elif t.device != q.device:
            raise ValueError(f"flash3: {name} is on {t.device}, q on {q.device}")
    as_blocks = lambda t: t.to(torch.float32).reshape(batch, -1, 1).contiguous()
    q_heads = given["q_descale"].repeat_interleave(heads_q // heads_k, dim=1)
    return (as_blocks(q_heads), max(seqlen_q, 1), as_blocks(given["k_descale"]), max(seqlen_k, 1),
            as_blocks(given["v_descale"]), max(seqlen_k, 1))


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
    sinks=None,
):
    """Exact attention: softmax(softmax_scale * q k^T [causal mask]) v, per head.

    q: (batch, seqlen_q, heads, headdim); k, v: (batch, seqlen_k, heads_k, headdim) with
    heads % heads_k == 0 (GQA/MQA); float16 or bfloat16 on one Hopper GPU, last dim
    contiguous. softmax_scale defaults to 1/sqrt(headdim). causal aligns the mask to the
    bottom-right corner: query i sees keys j <= i + seqlen_k - seqlen_q.

    FP8: q, k, v torch.float8_e4m3fn (head dim 64, 128 or 256) with q_descale, k_descale
    and v_descale, float32 (batch, heads_k), 1.0 where None: the attention of
    float(q) * q_descale[b, h] etc.; out is bfloat16. V is copied into the layout FP8
    tensor cores need (one extra pass over V).

    Returns out (like q), or (out, softmax_lse) when return_attn_probs: the natural-log
    log-sum-exp of each row of scores, float32 (batch, heads, seqlen_q), +inf for rows
    that see no key (their output is zero).

    Differentiable for float16/bfloat16: dq, dk, dv shaped and typed like q, k, v (GQA:
    dk, dv summed over the query heads of each kv head; rows that see no key contribute
    nothing). deterministic=True makes them bitwise identical from run to run.

    sinks (flash3's, not FlashAttention-3's; float16/bfloat16 only): learnable attention
    sinks as gpt-oss has them, a float32 (heads,) tensor: each row of head h has one more
    logit, sinks[h], in its softmax, which takes probability but adds no value (softmax_lse
    includes it). Differentiable in sinks too (dsinks, float32, the same bits every run).
    """
    if qv is not None or sm_margin != 0 or softmax_scale == 0.0:
        _refuse_unsupported(qv, num_splits, sm_margin, softmax_scale)
    window_left, window_right = _window(window_size)
    fp8 = isinstance(q, torch.Tensor) and q.dtype == torch.float8_e4m3fn
    if fp8 and sinks is not None:
        raise _not_supported("sinks with float8_e4m3fn inputs", sinks)
    if fp8 and ((window_left, window_right) != (-1, -1) or attention_chunk != 0 or softcap != 0.0):
        raise _not_supported("window_size, attention_chunk or softcap with float8_e4m3fn inputs", window_size)
    if fp8:
        out, softmax_lse = ops.fwd_fp8(q, k, v, *_head_descales(q, k, q_descale, k_descale, v_descale),
                                       softmax_scale, causal, torch.bfloat16)
    else:
        if q_descale is not None or k_descale is not None or v_descale is not None:
            raise ValueError("flash3: q_descale, k_descale and v_descale are for float8_e4m3fn inputs only")
        out, softmax_lse = ops.fwd(q, k, v, softmax_scale, causal, deterministic, sinks, window_left, window_right,
                                   attention_chunk, softcap)
    return (out, softmax_lse) if return_attn_probs else out


def flash_attn_qkvpacked_func(
    qkv,
    softmax_scale=None,
    causal=False,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    deterministic=False,
    num_heads_q=None,
    sm_margin=0,
    return_attn_probs=False,
):
    """flash_attn_func on q, k, v packed in one tensor: qkv (batch, seqlen, 3, heads,
    headdim), or with num_heads_q (batch, seqlen, num_heads_q + 2 * heads_k, headdim) for
    GQA (q's heads first, then k's, then v's). q, k and v are read in place (views)."""
    if not isinstance(qkv, torch.Tensor):
        raise ValueError("flash3: qkv must be a torch.Tensor")
    if num_heads_q is None:
        if qkv.dim() != 5 or qkv.shape[2] != 3:
            raise ValueError(f"flash3: qkv must be (batch, seqlen, 3, heads, headdim), got {tuple(qkv.shape)}")
        q, k, v = qkv.unbind(dim=2)
    else:
        if qkv.dim() != 4 or (qkv.shape[2] - num_heads_q) <= 0 or (qkv.shape[2] - num_heads_q) % 2:
            raise ValueError(f"flash3: qkv must be (batch, seqlen, num_heads_q + 2 * heads_k, headdim) "
                             f"with num_heads_q={num_heads_q}, got {tuple(qkv.shape)}")
        heads_k = (qkv.shape[2] - num_heads_q) // 2
        q, k, v = qkv.split([num_heads_q, heads_k, heads_k], dim=2)
    return flash_attn_func(q, k, v, softmax_scale, causal, None, q_descale, k_descale, v_descale,
                           window_size, attention_chunk, softcap, 1, None, deterministic, sm_margin,
                           return_attn_probs)


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    seqused_q=None,
    seqused_k=None,
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
    """Attention over a packed variable-length batch: q (total_q, heads, headdim), k and v
    (total_k, heads_k, headdim); sequence b's rows are [cu_seqlens_q[b], cu_seqlens_q[b + 1])
    (int32, batch + 1 offsets, on q's device), causal bottom-right per sequence; with
    seqused_q / seqused_k ((batch,) int32) sequence b uses only its first seqused_q[b] queries
    and seqused_k[b] keys (out's other rows are left unwritten; their gradients are zeros).
    Returns out like q, or (out, softmax_lse (heads, total_q)) when return_attn_probs.
    Differentiable; deterministic=True makes the gradients bitwise repeatable."""
    if qv is not None or sm_margin != 0 or softmax_scale == 0.0:
        _refuse_unsupported(qv, num_splits, sm_margin, softmax_scale)
    _refuse_given(("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))
    window = _window_tensor(window_size)
    if window is not None:  # read where the operator runs, not while torch traces this call
        out, softmax_lse = _window_ops.fwd_varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, causal, seqused_q,
            seqused_k, deterministic, window, attention_chunk, softcap)
        return (out, softmax_lse) if return_attn_probs else out
    window_left, window_right = _window(window_size)
    out, softmax_lse = ops.fwd_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, causal,
                                      seqused_q, seqused_k, deterministic, window_left, window_right,
                                      attention_chunk, softcap)
    return (out, softmax_lse) if return_attn_probs else out


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    qv=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    page_table=None,
    cu_seqlens_q=None,
    cu_seqlens_k_new=None,
    max_seqlen_q=None,
    rotary_seqlens=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    rotary_interleaved=True,
    scheduler_metadata=None,
    num_splits=0,
    pack_gqa=None,
    sm_margin=0,
    return_softmax_lse=False,
):
    """Attention of q (batch, seqlen_q, heads_q, headdim) against a KV cache: k_cache and
    v_cache (kv_batch, capacity, heads_k, headdim), of which batch b uses the first
    cache_seqlens[b] slots (an int for all, a (batch,) int32 tensor, or None for all
    `capacity`) of cache batch cache_batch_idx[b] (None: b); or, with page_table (batch,
    pages) int32, a pool of pages (num_pages, page_size, heads_k, headdim) whose rows
    batch b reads in the order of page_table[b] (capacity pages x page_size; page_size a
    multiple of 16). Causal is bottom-right per batch. Decoding (seqlen_q 1) with GQA packs each K/V head's query heads into one tile
    and splits the keys over the SMs itself (num_splits is a hint it ignores). Returns out like q,
    or (out, softmax_lse (batch, heads_q, seqlen_q)) when return_softmax_lse.

    k and v (batch, seqlen_new, heads_k, headdim), when given, are written into the cache
    in place after each batch's cache_seqlens[b] keys (and attended to); with rotary_cos
    and rotary_sin ((seqlen_ro, rotary_dim / 2), q's dtype, seqlen_ro at least the
    capacity) k is rotated to positions cache_seqlens[b] + i on the way, and q to
    cache_seqlens[b] + i when causal, else cache_seqlens[b] (interleaved pairs (2i, 2i+1)
    or halves); rotary_seqlens ((batch,) int32) replaces cache_seqlens in those positions
    (it means nothing without rotary tables). cache_leftpad ((batch,) int32, contiguous
    caches only): batch b attends to slots [cache_leftpad[b], cache_seqlens[b]) (new keys
    still go to cache_seqlens[b]). scheduler_metadata (get_scheduler_metadata's) is
    accepted and unused. Not yet: varlen q (cu_seqlens_q, cu_seqlens_k_new), rotary without
    k; each raises NotImplementedError naming it."""
    if qv is not None or sm_margin != 0 or softmax_scale == 0.0:
        _refuse_unsupported(qv, num_splits, sm_margin, softmax_scale)
    window_left, window_right = _window(window_size)
    _refuse_given(("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k_new", cu_seqlens_k_new),
                  ("max_seqlen_q", max_seqlen_q),
                  ("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))
    if (k is None) != (v is None):
        raise ValueError("flash3: k and v (the new keys and values) go together")
    if k is None and (rotary_cos is not None or rotary_sin is not None):
        raise _not_supported("rotary_cos without k", rotary_cos)
    if cache_seqlens is None or isinstance(cache_seqlens, int):
        capacity = k_cache.shape[1] * (1 if page_table is None else page_table.shape[1])
        used = capacity if cache_seqlens is None else cache_seqlens
        cache_seqlens = torch.full((q.shape[0],), used, dtype=torch.int32, device=q.device)
    if k is not None:
        q_rotated, cache_seqlens = ops.kvcache_append(
            q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, page_table, rotary_cos,
            rotary_sin, rotary_interleaved, causal, rotary_seqlens if rotary_cos is not None else None)
        if rotary_cos is not None:
            q = q_rotated
    out, softmax_lse = ops.fwd_kvcache(q, k_cache, v_cache, cache_seqlens, cache_batch_idx,
                                       softmax_scale, causal, page_table, cache_leftpad, window_left,
                                       window_right, attention_chunk, softcap)
    return (out, softmax_lse) if return_softmax_lse else out


def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None):
    """Merges split-KV partial results, as FlashAttention-3's flash_attn_combine.

    out_partial: float32 (num_splits, batch, seqlen, heads, headdim), head dim up to 1024;
    lse_partial: float32 (num_splits, batch, seqlen, heads); any strides, out_partial's last
    dimension contiguous. Per row, lse = logsumexp over the splits and out = sum_i
    exp(lse_partial[i] - lse) * out_partial[i], a weight that is inf or NaN counting as 0 (a
    row whose splits are all -inf gets zeros and lse -inf).

    Returns (out, lse): out (batch, seqlen, heads, headdim) in out_dtype (float32, float16
    or bfloat16; by default out's dtype when out is given, else float32), lse float32
    (batch, seqlen, heads) (a transposed (batch, heads, seqlen) tensor, as
    FlashAttention-3's). With `out` the result is copied into it and out is returned.
    """
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise ValueError(f"flash3: out must be a torch.Tensor, got {type(out).__name__}")
        if out_dtype is None:
            out_dtype = out.dtype
        elif out.dtype != out_dtype:
            raise ValueError(f"flash3: out.dtype is {out.dtype} but out_dtype is {out_dtype}")
        if isinstance(out_partial, torch.Tensor) and out.shape != out_partial.shape[1:]:
            raise ValueError(f"flash3: out must be (batch, seqlen, heads, headdim) = "
                             f"{tuple(out_partial.shape[1:])}, got {tuple(out.shape)}")
    result, softmax_lse = ops.combine(out_partial, lse_partial, out_dtype)
    if out is None:
        return result, softmax_lse
    out.copy_(result)
    return out, softmax_lse


def get_scheduler_metadata(batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv,
                           headdim, cache_seqlens, qkv_dtype=torch.bfloat16, headdim_v=None,
                           cu_seqlens_q=None, cu_seqlens_k_new=None, cache_leftpad=None,
                           page_size=None, max_seqlen_k_new=0, causal=False, window_size=(-1, -1),
                           attention_chunk=0, has_softcap=False, num_splits=0, pack_gqa=None,
                           sm_margin=0):
    """FlashAttention-3's precomputed split-KV schedule for flash_attn_with_kvcache. flash3
    plans its splits on the device in each call, so there is nothing to precompute: this
    returns an empty int32 tensor on cache_seqlens' device, which flash_attn_with_kvcache
    accepts as scheduler_metadata and does not read."""
    if not isinstance(cache_seqlens, torch.Tensor):
        raise ValueError("flash3: cache_seqlens must be a tensor")
    return torch.empty(0, dtype=torch.int32, device=cache_seqlens.device)


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
    q8, q_descale = ops.quantize_fp8(q, rows(q), incoherent, seed)
    k8, k_descale = ops.quantize_fp8(k, rows(k), incoherent, seed)
    # V's codes straight into the layout the FP8 kernel reads (no re-layout per call).
    v8, v_descale = ops.quantize_fp8_v(v, rows(v))
    out, _ = ops.fwd_fp8(q8, k8, v8, q_descale, rows(q), k_descale, rows(k), v_descale, rows(v),
                         softmax_scale, causal, q.dtype, True)
    return out
