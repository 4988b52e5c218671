"""flash3's registered PyTorch operators (torch.ops.flash3.*): torch.library.opcheck,
torch.compile(fullgraph=True) against eager, CUDA graph capture and replay, and the
FlashAttention-3 names of flash3.flash_attn_interface. GPU cases need a Hopper GPU."""
import pytest

torch = pytest.importorskip("torch")

import flash3.flash_attn_interface as fai  # noqa: E402
from flash3.flash_attn_interface import flash_attn_func, ops  # noqa: E402

requires_hopper = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs a Hopper (sm_90) GPU",
)


def qkv(batch=2, seqlen_q=200, seqlen_k=333, heads=4, heads_k=2, headdim=128, dtype=torch.bfloat16,
        requires_grad=False):
    make = lambda s, h: torch.randn(batch, s, h, headdim, device="cuda", dtype=dtype,
                                    requires_grad=requires_grad)
    return make(seqlen_q, heads), make(seqlen_k, heads_k), make(seqlen_k, heads_k)


def test_every_operator_is_registered():
    for name in ("fwd", "fwd_out", "bwd", "bwd_out", "fwd_fp8", "quantize_fp8"):
        assert hasattr(ops, name), name


@pytest.mark.parametrize("name", ["flash_attn_varlen_func", "flash_attn_with_kvcache", "flash_attn_combine",
                                  "get_scheduler_metadata"])
def test_fa3_names_not_implemented_yet_raise(name):
    with pytest.raises(NotImplementedError, match=f"flash3: {name} .* is not implemented yet"):
        getattr(fai, name)()


def test_fake_implementations_give_the_outputs_shapes():
    # The Meta kernels: what torch.compile traces with; no GPU needed.
    q = torch.empty(2, 100, 8, 128, device="meta", dtype=torch.bfloat16)
    k = torch.empty(2, 300, 2, 128, device="meta", dtype=torch.bfloat16)
    out, lse = ops.fwd(q, k, k, None, True)
    assert out.shape == q.shape and out.dtype == q.dtype and out.stride() == q.stride()
    assert lse.shape == (2, 8, 100) and lse.dtype == torch.float32
    dq, dk, dv = ops.bwd(q, q, k, k, q, lse)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, k.shape)
    x8, descale = ops.quantize_fp8(k, 128)
    assert x8.dtype == torch.float8_e4m3fn and descale.shape == (2, 2, 3)
    out8, _ = ops.fwd_fp8(q.to(torch.float8_e4m3fn), x8, x8, descale, 100, descale, 128, descale, 128)
    assert out8.dtype == torch.bfloat16 and out8.shape == q.shape


@requires_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_opcheck(causal):
    q, k, v = qkv()
    out, lse = ops.fwd(q, k, v, None, causal)
    dout = torch.randn_like(out)
    cases = [
        (ops.fwd.default, (q, k, v, None, causal)),
        (ops.fwd.default, (q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), 0.1, causal)),
        (ops.fwd_out.default, (q.detach(), k.detach(), v.detach(), torch.empty_like(out), torch.empty_like(lse),
                               None, causal)),
        (ops.bwd.default, (dout, q.detach(), k.detach(), v.detach(), out, lse, None, causal, True)),
        (ops.bwd_out.default, (dout, q.detach(), k.detach(), v.detach(), out, lse, torch.empty_like(q),
                               torch.empty_like(k), torch.empty_like(v), None, causal, True)),
        (ops.quantize_fp8.default, (q.detach(), 128, True, 7)),
    ]
    q8, qd = ops.quantize_fp8(q.detach(), 128, False, 0)
    k8, kd = ops.quantize_fp8(k.detach(), 128, False, 0)
    v8, vd = ops.quantize_fp8(v.detach(), 128, False, 0)
    for op, args in cases:
        torch.library.opcheck(op, args)
    # opcheck's schema test compares inputs with arithmetic PyTorch lacks for float8
    # ("mul_cuda" not implemented for 'Float8_e4m3fn'): the other tests here, and the
    # check that fwd_fp8 leaves its inputs as they were, which the schema promises.
    fp8_args = (q8, k8, v8, qd, 128, kd, 128, vd, 128, None, causal, torch.float16)
    torch.library.opcheck(ops.fwd_fp8.default, fp8_args,
                          test_utils=("test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic"))
    before = [t.view(torch.uint8).clone() if t.dtype == torch.float8_e4m3fn else t.clone()
              for t in (q8, k8, v8, qd, kd, vd)]
    ops.fwd_fp8(*fp8_args)
    after = [t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t for t in (q8, k8, v8, qd, kd, vd)]
    assert all(torch.equal(b, a) for b, a in zip(before, after))


def _grads(fn, q, k, v, dout):
    out = fn(q, k, v)
    return (out, *torch.autograd.grad(out, (q, k, v), dout))


@requires_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_torch_compile_fullgraph_matches_eager(causal):
    q, k, v = qkv(requires_grad=True)
    dout = torch.randn_like(q)

    def attention(q, k, v):
        return flash_attn_func(q * 1.0, k, v, causal=causal, deterministic=True).float().sin()

    compiled = torch.compile(attention, fullgraph=True)
    eager = _grads(attention, q, k, v, dout.float())
    traced = _grads(compiled, q, k, v, dout.float())
    for e, t in zip(eager, traced):
        torch.testing.assert_close(t, e)


@requires_hopper
def test_cuda_graph_replay_matches_eager():
    q, k, v = qkv(requires_grad=True)
    dout = torch.randn_like(q)
    step = lambda: _grads(lambda q, k, v: flash_attn_func(q, k, v, causal=True, deterministic=True),
                          q, k, v, dout)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        eager = step()  # warm-up off the default stream, as capture wants
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    with torch.no_grad():
        for x in (q, k, v, dout):
            x.copy_(torch.randn_like(x))
    graph.replay()
    expected = step()
    for e, c in zip(expected, captured):
        assert torch.equal(e, c)


@requires_hopper
def test_qkvpacked_matches_separate_tensors():
    batch, seqlen, heads, headdim = 2, 257, 4, 64
    qkv_packed = torch.randn(batch, seqlen, 3, heads, headdim, device="cuda", dtype=torch.float16)
    out = fai.flash_attn_qkvpacked_func(qkv_packed, causal=True)
    q, k, v = qkv_packed.unbind(2)
    assert torch.equal(out, flash_attn_func(q, k, v, causal=True))
    # GQA packing: num_heads_q query heads, then heads_k key heads, then heads_k value heads.
    gqa = torch.randn(batch, seqlen, 8 + 2 * 2, headdim, device="cuda", dtype=torch.float16)
    out, lse = fai.flash_attn_qkvpacked_func(gqa, num_heads_q=8, return_attn_probs=True)
    q, k, v = gqa.split([8, 2, 2], dim=2)
    expected, expected_lse = flash_attn_func(q, k, v, return_attn_probs=True)
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)


@requires_hopper
def test_split_forward_in_a_cuda_graph_matches_eager():
    # Non-causal with a last wave split in pieces: under capture the workspace is a fresh
    # zeroed one from the graph's pool (eagerly, one kept per stream); the same pieces,
    # the same bits.
    q, k, v = qkv(2, 3000, 3000, 13, 13, 128)
    eager = flash_attn_func(q, k, v)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        flash_attn_func(q, k, v)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = flash_attn_func(q, k, v)
    for _ in range(2):
        captured.zero_()
        graph.replay()
        assert torch.equal(captured, eager)


@requires_hopper
def test_bare_pointer_tensors_are_checked_for_shape():
    # softmax_lse and the FP8 descales reach flash3 as bare pointers: their shapes are
    # checked by the operators, so a short one is refused instead of overrun.
    q, k, v = qkv()
    out = torch.empty_like(q)
    short_lse = torch.empty(q.shape[0], q.shape[2], q.shape[1] - 1, device="cuda")
    with pytest.raises(ValueError, match=r"softmax_lse must be a contiguous float32 tensor \(batch, heads_q, seqlen_q\)"):
        ops.fwd_out(q, k, v, out, short_lse, None, False)
    q8, qd = ops.quantize_fp8(q, 128)
    k8, kd = ops.quantize_fp8(k, 128)
    v8, vd = ops.quantize_fp8(v, 128)
    with pytest.raises(ValueError, match=r"q_descale must be a contiguous float32 tensor \(batch, heads, blocks\)"):
        ops.fwd_fp8(q8, k8, v8, qd[:, :, :1].contiguous(), 128, kd, 128, vd, 128)
