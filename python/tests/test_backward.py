"""Gradients of flash_attn_func against float64 autograd; the GPU cases need PyTorch and
a Hopper GPU (they skip elsewhere, as the whole module does without PyTorch).

Tolerance (as FlashAttention's tests, and test_flash3.py's for the forward): for each of
dq, dk and dv, flash3's error against the float64 reference may be at most twice that of
the same attention computed plainly by PyTorch in the input dtype (autograd through
matmuls in that dtype, softmax in float32), plus an atol of two roundings of the gradient
to the input dtype (at least 1e-4).
"""
import pytest

torch = pytest.importorskip("torch")

from flash3.flash_attn_interface import _backward, _forward  # noqa: E402

from test_flash3 import call, requires_hopper, scores_and_values  # noqa: E402

DTYPES = [torch.float16, torch.bfloat16]
HEADDIMS = [64, 128, 256]
# batch, seqlen_q, seqlen_k, heads, heads_k
SHAPES = [
    (2, 128, 128, 4, 4),
    (1, 333, 333, 3, 3),  # seqlen not a multiple of any tile
    (2, 300, 777, 4, 2),  # GQA, seqlen_q < seqlen_k
    (1, 513, 200, 8, 1),  # MQA; causal rows before seqlen_q - seqlen_k see no key
]
MIN_ATOL = 1e-4


def attention(q, k, v, causal, dtype):
    """Attention in `dtype` (scores and softmax in float32 at least), differentiable by
    autograd, with zero output and zero gradients for rows that see no key."""
    scores, v = scores_and_values(q, k, v, causal, dtype)
    # Softmax without NaN in its gradient for a row of -inf only: the shift is a constant
    # (softmax does not depend on it), and an empty row divides by 1.
    shift = scores.detach().amax(dim=-1, keepdim=True)
    shift = shift.masked_fill(shift == float("-inf"), 0.0)
    e = torch.exp(scores - shift)
    total = e.sum(dim=-1, keepdim=True)
    p = e / total.masked_fill(total == 0, 1.0)
    return torch.einsum("bhqk,bkhd->bqhd", p.to(dtype), v)


def attention_grads(q, k, v, dout, causal, dtype):
    """(dq, dk, dv) of attention() in `dtype`, as float64."""
    leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
    attention(*leaves, causal, dtype).backward(dout.to(dtype))
    return [x.grad.double() for x in leaves]


def assert_within_tolerance(name, got, ref, plain, dtype):
    """got (flash3's, in dtype) against ref (float64) by the rule in this module's doc."""
    assert got.shape == ref.shape and got.dtype == dtype, name
    rounded = ref.to(dtype)
    atol = max(2 * (rounded + 0.3 - 0.3 - rounded).abs().max().item(), MIN_ATOL)
    error = (got.double() - ref).abs().max().item()
    plain_error = (plain - ref).abs().max().item()
    assert error <= 2 * plain_error + atol, f"{name}: flash3 {error:.3g}, plain {plain_error:.3g}"


def assert_grads_match_reference(q, k, v, dout, causal, grads):
    ref = attention_grads(q, k, v, dout, causal, torch.float64)
    plain = attention_grads(q, k, v, dout, causal, q.dtype)
    for name, got, r, p in zip(("dq", "dk", "dv"), grads, ref, plain):
        assert_within_tolerance(name, got, r, p, q.dtype)


def make(batch, seqlen, heads, headdim, dtype, requires_grad=True):
    x = torch.randn(batch, seqlen, heads, headdim, device="cuda", dtype=dtype)
    return x.requires_grad_(requires_grad)


def qkv(batch, seqlen_q, seqlen_k, heads, heads_k, headdim, dtype):
    return (make(batch, seqlen_q, heads, headdim, dtype), make(batch, seqlen_k, heads_k, headdim, dtype),
            make(batch, seqlen_k, heads_k, headdim, dtype))


def grads_of(q, k, v, dout, **kwargs):
    """(dq, dk, dv) of flash_attn_func through autograd."""
    out = call(q, k, v, **kwargs)
    try:
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    except NotImplementedError as e:
        if "not in this build" in str(e):
            pytest.skip(str(e))
        raise
    return dq, dk, dv


@requires_hopper
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("headdim", HEADDIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_grads_match_reference(shape, headdim, causal, dtype):
    q, k, v = qkv(*shape, headdim, dtype)
    dout = torch.randn_like(q)
    grads = grads_of(q, k, v, dout, causal=causal)
    assert_grads_match_reference(q, k, v, dout, causal, grads)


@requires_hopper
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_non_contiguous_inputs(dtype, causal):
    # (batch, heads, seqlen, headdim) memory viewed as (batch, seqlen, heads, headdim).
    batch, seqlen_q, seqlen_k, heads, heads_k, headdim = 2, 257, 400, 4, 2, 128
    bhsd = lambda s, h: torch.randn(batch, h, s, headdim, device="cuda", dtype=dtype).transpose(1, 2)  # noqa: E731
    q, k, v = bhsd(seqlen_q, heads), bhsd(seqlen_k, heads_k), bhsd(seqlen_k, heads_k)
    for x in (q, k, v):
        x.requires_grad_()
    assert not q.is_contiguous() and q.stride(-1) == 1
    dout = torch.randn_like(q)
    grads = grads_of(q, k, v, dout, causal=causal)
    assert_grads_match_reference(q, k, v, dout, causal, grads)


@requires_hopper
@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_qkv(dtype):
    qkv_packed = torch.randn(2, 333, 3, 4, 64, device="cuda", dtype=dtype, requires_grad=True)
    q, k, v = qkv_packed.unbind(2)  # strided views: seqlen stride 3 * heads * headdim
    dout = torch.randn_like(q)
    grads = grads_of(q, k, v, dout, causal=True)
    assert_grads_match_reference(q, k, v, dout, True, grads)


@requires_hopper
def test_dout_of_any_layout():
    q, k, v = qkv(2, 200, 300, 4, 2, 128, torch.bfloat16)
    # Last dim strided: flash3 gets a contiguous copy.
    wide = torch.randn(*q.shape[:3], 2 * q.shape[3], device="cuda", dtype=q.dtype)
    dout = wide[..., ::2]
    assert dout.stride(-1) != 1
    assert_grads_match_reference(q, k, v, dout, True, grads_of(q, k, v, dout, causal=True))
    # out.sum(): autograd's dout is a scalar expanded (all strides 0).
    q.grad = k.grad = v.grad = None
    call(q, k, v, causal=True).sum().backward()
    ones = torch.ones_like(q)
    assert_grads_match_reference(q, k, v, ones, True, (q.grad, k.grad, v.grad))


@requires_hopper
def test_softmax_scale_and_only_some_inputs_require_grad():
    q, k, v = qkv(1, 256, 256, 2, 2, 64, torch.float16)
    k.requires_grad_(False)
    dout = torch.randn_like(q)
    out = call(q, k, v, softmax_scale=0.5 * 64 ** -0.5)
    dq, dv = torch.autograd.grad(out, (q, v), dout)
    # The same attention as the default scale on q / 2 (exact in float16), whose
    # gradient is twice dq.
    q_half = 0.5 * q.detach()
    ref_dq, _, ref_dv = attention_grads(q_half, k, v, dout, False, torch.float64)
    plain_dq, _, plain_dv = attention_grads(q_half, k, v, dout, False, torch.float16)
    assert_within_tolerance("dq", dq, 0.5 * ref_dq, 0.5 * plain_dq, torch.float16)
    assert_within_tolerance("dv", dv, ref_dv, plain_dv, torch.float16)


@requires_hopper
def test_writes_every_element():
    q, k, v = (x.detach() for x in qkv(1, 513, 200, 8, 2, 128, torch.bfloat16))
    out, lse = _forward(q, k, v, None, True)
    dout = torch.randn_like(q)
    grads = [torch.full_like(x, float("nan")) for x in (q, k, v)]
    try:
        _backward(dout, q, k, v, out, lse, None, True, False, *grads)
    except NotImplementedError as e:
        if "not in this build" in str(e):
            pytest.skip(str(e))
        raise
    assert_grads_match_reference(q, k, v, dout, True, grads)


@requires_hopper
@pytest.mark.parametrize("heads_k", [8, 2])
def test_deterministic_is_bitwise_reproducible(heads_k):
    # Many key blocks per query block and many query heads per kv head: the fp32 sums
    # (dQ over key blocks, dK/dV over query heads) have many addends.
    q, k, v = qkv(2, 1024, 2048, 8, heads_k, 128, torch.bfloat16)
    dout = torch.randn_like(q)
    first = grads_of(q, k, v, dout, causal=False, deterministic=True)
    for _ in range(9):
        again = grads_of(q, k, v, dout, causal=False, deterministic=True)
        for a, b in zip(first, again):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    assert_grads_match_reference(q, k, v, dout, False, first)


@requires_hopper
def test_runs_on_the_current_stream_and_in_a_cuda_graph():
    q, k, v = (x.detach() for x in qkv(2, 300, 500, 4, 2, 128, torch.bfloat16))
    out, lse = _forward(q, k, v, None, True)
    dout = torch.randn_like(q)
    try:
        expected = _backward(dout, q, k, v, out, lse, None, True, True)
    except NotImplementedError as e:
        if "not in this build" in str(e):
            pytest.skip(str(e))
        raise
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _backward(dout, q, k, v, out, lse, None, True, True)  # warm-up off the default stream
        late_dout = torch.zeros_like(dout)
        torch.cuda._sleep(100_000_000)  # dout arrives late: a call on another stream would miss it
        late_dout.copy_(dout)
        eager = _backward(late_dout, q, k, v, out, lse, None, True, True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _backward(dout, q, k, v, out, lse, None, True, True)
    graph.replay()
    torch.cuda.synchronize()
    for e, a, c in zip(expected, eager, captured):
        assert torch.equal(e, a)
        assert torch.equal(e, c)  # deterministic: bitwise


@requires_hopper
def test_fp8_has_no_backward():
    q, k, v = (torch.randn(1, 128, 2, 128, device="cuda").to(torch.float8_e4m3fn) for _ in range(3))
    try:
        q.requires_grad_()
    except RuntimeError as e:  # a PyTorch without float8 autograd
        pytest.skip(str(e))
    descale = torch.ones(1, 2, device="cuda")
    out = call(q, k, v, q_descale=descale, k_descale=descale, v_descale=descale)
    with pytest.raises(NotImplementedError, match="the FP8 path has no backward yet"):
        out.float().sum().backward()


@requires_hopper
@pytest.mark.parametrize("varlen", [False, True])
def test_backward_peak_memory_is_gradients_and_workspace(varlen):
    """Through autograd a backward allocates dq, dk, dv and its workspace (the fp32 dQ sums and
    two fp32 row arrays), nothing of the size of the log-sum-exp beyond them: no zeros for lse's
    gradient, which nothing reads (rows of 2 MiB here, so one more would show)."""
    from flash3.flash_attn_interface import flash_attn_func, flash_attn_varlen_func

    batch, seqlen, heads, headdim = 4, 4096, 32, 64
    q, k, v = qkv(batch, seqlen, seqlen, heads, heads, headdim, torch.bfloat16)
    dout = torch.randn_like(q)
    if varlen:
        cu = torch.arange(0, (batch + 1) * seqlen, seqlen, dtype=torch.int32, device="cuda")
        flat = [x.reshape(batch * seqlen, heads, headdim) for x in (q, k, v)]
        out, lse = flash_attn_varlen_func(*flat, cu, cu, seqlen, seqlen, return_attn_probs=True)
        dout = dout.reshape(out.shape)
    else:
        out, lse = flash_attn_func(q, k, v, return_attn_probs=True)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    grads = torch.autograd.grad(out, (q, k, v), dout)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    rows = batch * heads * seqlen  # a multiple of every backward's 64 or 128 query rows
    # varlen's workspace pads each sequence's rows by one block (128 rows).
    padded_rows = rows + (batch + 1) * heads * 128 if varlen else rows
    bound = 3 * q.numel() * 2 + padded_rows * headdim * 4 + 2 * padded_rows * 4 + 256 * 1024
    assert peak <= bound, f"peak {peak / 2**20:.2f} MiB over {bound / 2**20:.2f} MiB"
    assert all(torch.isfinite(g).all() for g in grads)
