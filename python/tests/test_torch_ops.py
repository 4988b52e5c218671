"""flash3's registered PyTorch operators (torch.ops.flash3.*): torch.library.opcheck,
torch.compile(fullgraph=True) against eager, CUDA graph capture and replay, and the
FlashAttention-3 names of flash3.flash_attn_interface. GPU cases need a Hopper GPU."""
import itertools

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
    for name in ("fwd", "fwd_out", "bwd", "bwd_sinks", "bwd_out", "fwd_fp8", "quantize_fp8",
                 "quantize_fp8_v", "fwd_varlen", "bwd_varlen", "fwd_kvcache", "kvcache_append"):
        assert hasattr(ops, name), name
    assert hasattr(ops, "combine")


def test_get_scheduler_metadata_is_an_empty_hint():
    # flash3 plans its splits in each call: the metadata is empty, and kvcache takes it.
    lengths = torch.tensor([5, 7], dtype=torch.int32)
    meta = fai.get_scheduler_metadata(2, 1, 64, 8, 2, 128, lengths, num_splits=3)
    assert meta.dtype == torch.int32 and meta.numel() == 0 and meta.device == lengths.device


def test_fake_implementations_give_the_outputs_shapes():
    # The Meta kernels: what torch.compile traces with; no GPU needed.
    q = torch.empty(2, 100, 8, 128, device="meta", dtype=torch.bfloat16)
    k = torch.empty(2, 300, 2, 128, device="meta", dtype=torch.bfloat16)
    out, lse = ops.fwd(q, k, k, None, True)
    assert out.shape == q.shape and out.dtype == q.dtype and out.stride() == q.stride()
    assert lse.shape == (2, 8, 100) and lse.dtype == torch.float32
    dq, dk, dv = ops.bwd(q, q, k, k, q, lse)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, k.shape)
    sinks = torch.empty(8, device="meta")
    *_, dsinks = ops.bwd_sinks(q, q, k, k, q, lse, sinks)
    assert dsinks.shape == (8,) and dsinks.dtype == torch.float32
    x8, descale = ops.quantize_fp8(k, 128)
    assert x8.dtype == torch.float8_e4m3fn and descale.shape == (2, 2, 3)
    out8, _ = ops.fwd_fp8(q.to(torch.float8_e4m3fn), x8, x8, descale, 100, descale, 128, descale, 128)
    assert out8.dtype == torch.bfloat16 and out8.shape == q.shape
    v8, v_descale = ops.quantize_fp8_v(k, 128)  # the Fp8V layout: seqlen 300 padded to 304
    assert v8.dtype == torch.float8_e4m3fn and v8.shape == (2, 2, 128, 304)
    assert v_descale.shape == (2, 2, 3)
    out8, _ = ops.fwd_fp8(q.to(torch.float8_e4m3fn), x8, v8, descale, 100, descale, 128,
                          v_descale, 128, None, False, None, True)
    assert out8.dtype == torch.bfloat16 and out8.shape == q.shape
    cu = torch.empty(3, dtype=torch.int32, device="meta")
    out_v, lse_v = ops.fwd_varlen(q[0], k[0], k[0], cu, cu, 100)
    assert out_v.shape == q[0].shape and lse_v.shape == (8, 100) and lse_v.dtype == torch.float32
    dq_v, dk_v, dv_v = ops.bwd_varlen(q[0], q[0], k[0], k[0], q[0], lse_v, cu, cu, 100)
    assert (dq_v.shape, dk_v.shape, dv_v.shape) == (q[0].shape, k[0].shape, k[0].shape)
    seqlens = torch.empty(2, dtype=torch.int32, device="meta")
    out_c, lse_c = ops.fwd_kvcache(q, k, k, seqlens, None, None, True)
    assert out_c.shape == q.shape and out_c.stride() == q.stride() and lse_c.shape == (2, 8, 100)


def test_fake_implementations_give_out_v_head_dim():
    # FlashAttention-3's dv != d: out takes v's head dim (contiguous), lse and dq are as before.
    q = torch.empty(2, 100, 8, 192, device="meta", dtype=torch.bfloat16)
    k = torch.empty(2, 300, 2, 192, device="meta", dtype=torch.bfloat16)
    v = torch.empty(2, 300, 2, 128, device="meta", dtype=torch.bfloat16)
    out, lse = ops.fwd(q, k, v, None, True)
    assert out.shape == (2, 100, 8, 128) and out.is_contiguous() and lse.shape == (2, 8, 100)
    cu = torch.empty(3, dtype=torch.int32, device="meta")
    out_v, _ = ops.fwd_varlen(q[0], k[0], v[0], cu, cu, 100)
    assert out_v.shape == (100, 8, 128)
    seqlens = torch.empty(2, dtype=torch.int32, device="meta")
    out_c, _ = ops.fwd_kvcache(q, k, v, seqlens, None, None, True)
    assert out_c.shape == (2, 100, 8, 128)


@requires_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d, dv", [(192, 128), (64, 256)])
def test_v_head_dim_of_its_own_matches_a_float32_attention(d, dv, causal):
    # DeepSeek's (192, 128) and FlashAttention-3's (64, 256): dense, varlen and KV cache forward,
    # and the backward; a pair without kernels is refused by name.
    q, k, _ = qkv(seqlen_q=300, seqlen_k=411, headdim=d)
    v = torch.randn(2, 411, 2, dv, device="cuda", dtype=torch.bfloat16)
    out, lse = fai.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    want, want_lse = _attention_in_a_window(q, k, v, causal, (-1, -1))
    assert out.shape == (2, 300, 4, dv)
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, want_lse, atol=1e-3, rtol=1e-3)
    cu = torch.tensor([0, 300, 600], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 411, 822], dtype=torch.int32, device="cuda")
    packed = fai.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu_k, 300, 411,
                                        causal=causal)
    torch.testing.assert_close(packed.view_as(out).float(), want, atol=2e-2, rtol=2e-2)
    cached = fai.flash_attn_with_kvcache(q, k, v, cache_seqlens=411, causal=causal)
    torch.testing.assert_close(cached.float(), want, atol=2e-2, rtol=2e-2)
    for x in (q, k, v):
        x.requires_grad_()
    out, lse = fai.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    want, want_lse = _attention_in_a_window(q, k, v, causal, (-1, -1))
    _expect_matches_float32(out, lse, want, want_lse, (q, k, v))
    with pytest.raises(NotImplementedError, match=r"v's head dim beside q's 128 must be one of 128"):
        fai.flash_attn_func(*qkv(headdim=128)[:2], torch.randn(2, 333, 2, 64, device="cuda", dtype=torch.bfloat16))


def test_fake_implementation_of_combine_gives_the_outputs_shapes():
    # As FlashAttention-3 allocates them: out (batch, seqlen, heads, headdim) in out_dtype
    # (float32 by default), lse (batch, seqlen, heads) transposed from (batch, heads, seqlen).
    out_partial = torch.empty(7, 2, 100, 8, 96, device="meta")
    lse_partial = torch.empty(7, 2, 100, 8, device="meta")
    out, lse = ops.combine(out_partial, lse_partial)
    assert out.shape == (2, 100, 8, 96) and out.dtype == torch.float32 and out.is_contiguous()
    assert lse.shape == (2, 100, 8) and lse.dtype == torch.float32 and lse.stride() == (800, 1, 100)
    out, _ = ops.combine(out_partial, lse_partial, torch.bfloat16)
    assert out.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="out_dtype is torch.float64"):
        ops.combine(out_partial, lse_partial, torch.float64)


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


@requires_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("headdim", [64, 128, 256])
def test_varlen_matches_each_sequence_alone(causal, headdim):
    # The packed batch against flash_attn_func on each sequence alone: the same kernels'
    # arithmetic on the same rows, so equal within the reduction order's rounding.
    lengths_q, lengths_k = [17, 1, 300, 129, 1000, 64], [40, 5, 300, 700, 1000, 7]
    make = lambda n, h: torch.randn(n, h, headdim, device="cuda", dtype=torch.bfloat16)
    q, k, v = make(sum(lengths_q), 4), make(sum(lengths_k), 2), make(sum(lengths_k), 2)
    offsets = lambda lengths: torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32,
                                           device="cuda")
    cu_q, cu_k = offsets(lengths_q), offsets(lengths_k)
    out, lse = fai.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal,
                                          return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (4, q.shape[0])
    for b in range(len(lengths_q)):
        qs = slice(int(cu_q[b]), int(cu_q[b + 1]))
        ks = slice(int(cu_k[b]), int(cu_k[b + 1]))
        alone, alone_lse = flash_attn_func(q[None, qs], k[None, ks], v[None, ks], causal=causal,
                                           return_attn_probs=True)
        torch.testing.assert_close(out[qs], alone[0], atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(lse[:, qs], alone_lse[0], atol=1e-3, rtol=1e-4)


def _varlen_batch(lengths_q, lengths_k, headdim, heads=4, heads_k=2):
    make = lambda n, h: torch.randn(n, h, headdim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    offsets = lambda lengths: torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32,
                                           device="cuda")
    return (make(sum(lengths_q), heads), make(sum(lengths_k), heads_k), make(sum(lengths_k), heads_k),
            offsets(lengths_q), offsets(lengths_k))


@requires_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("headdim", [64, 128, 256])
def test_varlen_backward_matches_each_sequence_alone(causal, headdim):
    # Autograd through flash_attn_varlen_func against flash_attn_func's backward on each
    # sequence alone; sequences without keys (or queries) get zero gradients.
    lengths_q, lengths_k = [17, 1, 300, 0, 129, 64, 3], [40, 5, 300, 9, 700, 7, 0]
    q, k, v, cu_q, cu_k = _varlen_batch(lengths_q, lengths_k, headdim)
    out = fai.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal)
    g = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), g)
    for b in range(len(lengths_q)):
        qs = slice(int(cu_q[b]), int(cu_q[b + 1]))
        ks = slice(int(cu_k[b]), int(cu_k[b + 1]))
        if lengths_q[b] == 0 or lengths_k[b] == 0:
            for grad in (dq[qs], dk[ks], dv[ks]):
                assert grad.numel() == 0 or grad.abs().max().item() == 0
            continue
        q1, k1, v1 = (x[None, s].detach().requires_grad_() for x, s in ((q, qs), (k, ks), (v, ks)))
        alone = flash_attn_func(q1, k1, v1, causal=causal)
        dq1, dk1, dv1 = torch.autograd.grad(alone, (q1, k1, v1), g[None, qs])
        for got, want in ((dq[qs], dq1[0]), (dk[ks], dk1[0]), (dv[ks], dv1[0])):
            torch.testing.assert_close(got, want, atol=3e-2, rtol=3e-2)


@requires_hopper
def test_varlen_backward_seqused_and_deterministic():
    # seqused: the unused rows get zero gradients; deterministic: bitwise repeatable.
    lengths = [100, 70, 3, 200]
    q, k, v, cu_q, cu_k = _varlen_batch(lengths, lengths, 128)
    used_q = torch.tensor([60, 70, 0, 131], dtype=torch.int32, device="cuda")
    used_k = torch.tensor([90, 1, 3, 64], dtype=torch.int32, device="cuda")
    grads = []
    for _ in range(3):
        out, lse = fai.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 200, 200, seqused_q=used_q,
                                              seqused_k=used_k, causal=True, deterministic=True,
                                              return_attn_probs=True)
        grads.append(torch.autograd.grad(out, (q, k, v), torch.ones_like(out)))
    # The forward's unused rows: zeros and a log-sum-exp of +inf (no kernel writes them).
    for b, length in enumerate(lengths):
        rows = slice(int(cu_q[b]) + min(int(used_q[b]), length), int(cu_q[b]) + length)
        assert out[rows].numel() == 0 or out[rows].abs().max().item() == 0
        assert bool(torch.isposinf(lse[:, rows]).all())
    for again in grads[1:]:
        for a, b in zip(grads[0], again):
            assert torch.equal(a, b)
    dq, dk, _ = grads[0]
    for b, length in enumerate(lengths):
        start = int(cu_q[b])
        unused_q = dq[start + min(int(used_q[b]), length):start + length]
        unused_k = dk[start + min(int(used_k[b]), length):start + length]
        for grad in (unused_q, unused_k):
            assert grad.numel() == 0 or grad.abs().max().item() == 0
    assert dq[:60].abs().max().item() > 0


@pytest.mark.parametrize("name", ["cu_seqlens_q", "cu_seqlens_k_new", "q_descale"])
def test_kvcache_arguments_not_implemented_yet_raise_by_name(name):
    q = torch.empty(2, 1, 8, 128, device="meta", dtype=torch.bfloat16)
    cache = torch.empty(2, 64, 2, 128, device="meta", dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match=f"flash3: {name}=a tensor is not supported yet"):
        fai.flash_attn_with_kvcache(q, cache, cache, **{name: torch.empty(1)})
    with pytest.raises(NotImplementedError, match="flash3: rotary_cos without k=a tensor is not supported yet"):
        fai.flash_attn_with_kvcache(q, cache, cache, rotary_cos=torch.empty(1), rotary_sin=torch.empty(1))
    with pytest.raises(ValueError, match="flash3: k and v"):
        fai.flash_attn_with_kvcache(q, cache, cache, k=cache[:, :1])
    # Speed hints: accepted (the Meta kernels give the shapes).
    out = fai.flash_attn_with_kvcache(q, cache, cache, num_splits=3, pack_gqa=True,
                                      scheduler_metadata=torch.empty(0, dtype=torch.int32))
    assert out.shape == q.shape


@requires_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q", [1, 6])
def test_kvcache_matches_each_batch_alone(causal, seqlen_q):
    # Against flash_attn_func on each batch's used cache rows: the same kernels' arithmetic.
    capacity, seqlens, batch_idx = 3000, [3000, 0, 1, 2048, 777], [4, 0, 2, 1, 5]
    q = torch.randn(len(seqlens), seqlen_q, 8, 128, device="cuda", dtype=torch.bfloat16)
    k_cache, v_cache = (torch.randn(6, capacity, 2, 128, device="cuda", dtype=torch.bfloat16)
                        for _ in range(2))
    lengths = torch.tensor(seqlens, dtype=torch.int32, device="cuda")
    index = torch.tensor(batch_idx, dtype=torch.int32, device="cuda")
    out, lse = fai.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, cache_batch_idx=index,
                                           causal=causal, return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (len(seqlens), 8, seqlen_q)
    for b, (n, i) in enumerate(zip(seqlens, batch_idx)):
        if n == 0:  # no keys: zero rows, +inf log-sum-exp
            assert torch.all(out[b] == 0) and torch.all(lse[b] == float("inf"))
            continue
        alone, alone_lse = flash_attn_func(q[b:b + 1], k_cache[i:i + 1, :n], v_cache[i:i + 1, :n], causal=causal,
                                           return_attn_probs=True)
        torch.testing.assert_close(out[b], alone[0], atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(lse[b], alone_lse[0], atol=1e-3, rtol=1e-4)
    # An int cache_seqlens for every batch, and None for the whole cache.
    same = fai.flash_attn_with_kvcache(q, k_cache[:5], v_cache[:5], cache_seqlens=capacity, causal=causal)
    whole = fai.flash_attn_with_kvcache(q, k_cache[:5], v_cache[:5], causal=causal)
    torch.testing.assert_close(same, whole, atol=0, rtol=0)
    torch.testing.assert_close(whole, flash_attn_func(q, k_cache[:5], v_cache[:5], causal=causal),
                               atol=2e-2, rtol=2e-2)


@requires_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_kvcache_leftpad_attends_to_the_slots_after_it(causal):
    # cache_leftpad[b]: batch b's keys are slots [leftpad, cache_seqlens), as flash_attn_func
    # on those rows alone; with new keys they still go to slot cache_seqlens[b].
    capacity, seqlens, leftpad = 1200, [1000, 7, 300, 1200], [100, 7, 0, 777]
    q = torch.randn(len(seqlens), 3, 8, 128, device="cuda", dtype=torch.bfloat16)
    k_cache, v_cache = (torch.randn(len(seqlens), capacity, 2, 128, device="cuda", dtype=torch.bfloat16)
                        for _ in range(2))
    lengths = torch.tensor(seqlens, dtype=torch.int32, device="cuda")
    pad = torch.tensor(leftpad, dtype=torch.int32, device="cuda")
    out = fai.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, cache_leftpad=pad,
                                      causal=causal)
    for b, (n, p) in enumerate(zip(seqlens, leftpad)):
        if n == p:
            assert torch.all(out[b] == 0)
            continue
        alone = flash_attn_func(q[b:b + 1], k_cache[b:b + 1, p:n], v_cache[b:b + 1, p:n], causal=causal)
        torch.testing.assert_close(out[b], alone[0], atol=2e-2, rtol=2e-2)
    k_new, v_new = (torch.randn(len(seqlens), 2, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    short = torch.tensor([n - 2 for n in seqlens], dtype=torch.int32, device="cuda").clamp(min=0)
    fai.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=short,
                                cache_leftpad=pad.clamp(max=short), causal=causal)
    for b, n in enumerate(seqlens):
        start = max(n - 2, 0)
        torch.testing.assert_close(k_cache[b, start:start + 2], k_new[b, :min(2, capacity - start)])
    with pytest.raises(NotImplementedError, match="cache_leftpad with a paged cache"):
        table = torch.arange(4 * 2, dtype=torch.int32, device="cuda").reshape(4, 2)
        pool = k_cache.reshape(-1, 16, 2, 128)[:8]
        fai.flash_attn_with_kvcache(q, pool, pool, cache_seqlens=torch.full_like(lengths, 20),
                                    cache_leftpad=torch.zeros_like(pad), page_table=table)


@requires_hopper
def test_kvcache_opcheck_and_compile():
    q = torch.randn(3, 1, 8, 64, device="cuda", dtype=torch.float16)
    k_cache, v_cache = (torch.randn(3, 2500, 2, 64, device="cuda", dtype=torch.float16) for _ in range(2))
    lengths = torch.tensor([2500, 1, 1300], dtype=torch.int32, device="cuda")
    torch.library.opcheck(ops.fwd_kvcache, (q, k_cache, v_cache, lengths, None, None, False))
    step = lambda q: fai.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths)
    torch.testing.assert_close(torch.compile(step, fullgraph=True)(q), step(q), atol=0, rtol=0)


@requires_hopper
@pytest.mark.parametrize("page_size", [16, 256])
@pytest.mark.parametrize("seqlen_q", [1, 5])
def test_paged_kvcache_matches_the_contiguous_cache(page_size, seqlen_q):
    # The same cache contents laid out in shuffled pages of a larger pool.
    batch, capacity, heads_k = 4, 2048, 2
    pages = capacity // page_size
    q = torch.randn(batch, seqlen_q, 8, 128, device="cuda", dtype=torch.bfloat16)
    k_cache, v_cache = (torch.randn(batch, capacity, heads_k, 128, device="cuda", dtype=torch.bfloat16)
                        for _ in range(2))
    perm = torch.randperm(batch * pages + 5, device="cuda", dtype=torch.int32)
    page_table = perm[:batch * pages].reshape(batch, pages).contiguous()
    k_pool, v_pool = (torch.randn(batch * pages + 5, page_size, heads_k, 128, device="cuda",
                                  dtype=torch.bfloat16) for _ in range(2))
    k_pool[page_table.flatten().long()] = k_cache.reshape(batch * pages, page_size, heads_k, 128)
    v_pool[page_table.flatten().long()] = v_cache.reshape(batch * pages, page_size, heads_k, 128)
    lengths = torch.tensor([capacity, 1, 0, 1000], dtype=torch.int32, device="cuda")
    for causal in (False, True):
        want = fai.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, causal=causal)
        got = fai.flash_attn_with_kvcache(q, k_pool, v_pool, cache_seqlens=lengths, page_table=page_table,
                                          causal=causal)
        torch.testing.assert_close(got, want, atol=0, rtol=0)


def _rotate(x, cos, sin, positions, interleaved):
    """flash_attn's apply_rotary_emb in float64: x (batch, seqlen, heads, d), row s of batch
    b at positions[b, s]; cos, sin (rows, rotary_dim / 2)."""
    x = x.double()
    rd = cos.shape[1] * 2
    c = cos.double()[positions.long()].unsqueeze(2)  # (batch, seqlen, 1, rd / 2)
    s = sin.double()[positions.long()].unsqueeze(2)
    if interleaved:
        x1, x2 = x[..., 0:rd:2], x[..., 1:rd:2]
        rot = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = x[..., :rd // 2], x[..., rd // 2:rd]
        rot = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return torch.cat((rot, x[..., rd:]), dim=-1)


@requires_hopper
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_kvcache_append_with_rotary(paged, interleaved, causal):
    # New keys appended (rotated) into the cache, q rotated, then attention over the longer
    # cache: against the same steps done with torch on a contiguous copy.
    torch.manual_seed(0)
    batch, capacity, seqlen_new, heads_k, d, rotary_dim = 3, 512, 4, 2, 128, 64
    q = torch.randn(batch, seqlen_new, 8, d, device="cuda", dtype=torch.bfloat16)
    k_new, v_new = (torch.randn(batch, seqlen_new, heads_k, d, device="cuda", dtype=torch.bfloat16)
                    for _ in range(2))
    k_cache, v_cache = (torch.randn(batch, capacity, heads_k, d, device="cuda", dtype=torch.bfloat16)
                        for _ in range(2))
    angle = torch.rand(capacity, rotary_dim // 2, device="cuda") * 6.28
    cos, sin = angle.cos().to(torch.bfloat16), angle.sin().to(torch.bfloat16)
    lengths = torch.tensor([0, 100, capacity - seqlen_new], dtype=torch.int32, device="cuda")
    positions = lengths.unsqueeze(1) + torch.arange(seqlen_new, device="cuda", dtype=torch.int32)
    k_want, v_want = k_cache.clone(), v_cache.clone()
    k_rot = _rotate(k_new, cos, sin, positions, interleaved).to(torch.bfloat16)
    for b in range(batch):
        n = int(lengths[b])
        k_want[b, n:n + seqlen_new] = k_rot[b]
        v_want[b, n:n + seqlen_new] = v_new[b]
    q_pos = positions if causal else lengths.unsqueeze(1).expand(-1, seqlen_new)
    q_want = _rotate(q, cos, sin, q_pos, interleaved).to(torch.bfloat16)
    if paged:
        page_size = 64
        pages = capacity // page_size
        page_table = torch.randperm(batch * pages, device="cuda", dtype=torch.int32).reshape(batch, pages)
        k_pool, v_pool = (torch.empty(batch * pages, page_size, heads_k, d, device="cuda", dtype=torch.bfloat16)
                          for _ in range(2))
        k_pool[page_table.flatten().long()] = k_cache.reshape(batch * pages, page_size, heads_k, d)
        v_pool[page_table.flatten().long()] = v_cache.reshape(batch * pages, page_size, heads_k, d)
        out = fai.flash_attn_with_kvcache(q, k_pool, v_pool, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                          cache_seqlens=lengths, page_table=page_table, causal=causal,
                                          rotary_interleaved=interleaved)
        k_got = k_pool[page_table.flatten().long()].reshape(batch, capacity, heads_k, d)
        v_got = v_pool[page_table.flatten().long()].reshape(batch, capacity, heads_k, d)
    else:
        out = fai.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                          cache_seqlens=lengths, causal=causal, rotary_interleaved=interleaved)
        k_got, v_got = k_cache, v_cache
    torch.testing.assert_close(v_got, v_want, atol=0, rtol=0)
    torch.testing.assert_close(k_got, k_want, atol=1e-2, rtol=1e-2)
    want = fai.flash_attn_with_kvcache(q_want, k_want, v_want, cache_seqlens=lengths + seqlen_new,
                                       causal=causal)
    torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2)
    q_rotated, seqlens = ops.kvcache_append(q, k_want.clone(), v_want.clone(), k_new, v_new, lengths,
                                            None, None, cos, sin, interleaved, causal)
    torch.testing.assert_close(q_rotated, q_want, atol=1e-2, rtol=1e-2)
    assert seqlens.tolist() == (lengths + seqlen_new).tolist()
    # rotary_seqlens: the rotary positions from another start (here 7 for every batch).
    starts = torch.full_like(lengths, 7)
    q_rotated, _ = ops.kvcache_append(q, k_want.clone(), v_want.clone(), k_new, v_new, lengths, None, None,
                                      cos, sin, interleaved, causal, starts)
    from_7 = starts.unsqueeze(1) + (torch.arange(seqlen_new, device="cuda", dtype=torch.int32) if causal else 0)
    torch.testing.assert_close(q_rotated, _rotate(q, cos, sin, from_7.expand(-1, seqlen_new), interleaved)
                               .to(torch.bfloat16), atol=1e-2, rtol=1e-2)


# ---------------------------------------------------------------- combine

def _combine_reference(out_partial, lse_partial):
    """FlashAttention-3's attention_combine_ref in float64: lse is the logsumexp over the
    splits, out the sum of exp(lse_i - lse) * out_i, a weight that is inf or NaN taken as 0."""
    out_partial, lse_partial = out_partial.double(), lse_partial.double()
    lse = torch.logsumexp(lse_partial, dim=0)
    scale = torch.exp(lse_partial - lse)
    scale = torch.where(torch.isinf(scale) | torch.isnan(scale), torch.zeros_like(scale), scale)
    return (scale.unsqueeze(-1) * out_partial).sum(0), lse


def _combine_inputs(num_splits, batch, seqlen, heads, headdim, strided):
    """Random partials; strided as in FlashAttention-3's test (out_partial a slice of a
    head-major tensor, lse_partial seqlen-contiguous with every other head). The back half
    of the splits of the first third of the batches is -inf (all of them with one split),
    and one row has no split at all."""
    if strided:
        out_partial = torch.randn(2 * num_splits, batch, heads, seqlen, headdim, device="cuda")
        out_partial = out_partial.transpose(2, 3)[:num_splits]
        lse_partial = torch.randn(num_splits, batch, 2 * heads, seqlen, device="cuda")
        lse_partial = lse_partial.transpose(-1, -2)[:, :, :, :heads]
    else:
        out_partial = torch.randn(num_splits, batch, seqlen, heads, headdim, device="cuda")
        lse_partial = torch.randn(num_splits, batch, seqlen, heads, device="cuda")
    lse_partial[num_splits // 2:, :batch // 3] = -float("inf")
    lse_partial[:, -1, -1, -1] = -float("inf")
    return out_partial, lse_partial


def _expect_combine_matches_reference(out, lse, out_partial, lse_partial, dtype):
    """FlashAttention-3's rule, element by element: |out - ref| at most twice the rounding
    of ref to out's dtype, plus 1e-5; lse within 1e-5 (absolute and relative)."""
    ref, ref_lse = _combine_reference(out_partial, lse_partial)
    assert out.dtype == dtype and out.shape == ref.shape and lse.shape == ref_lse.shape
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)
    error = (out.double() - ref).abs()
    bound = 2 * (ref.to(dtype).double() - ref).abs() + 1e-5
    assert bool((error <= bound).all()), f"max error {error.max().item()}, worst excess {(error - bound).max().item()}"


@requires_hopper
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("headdim", [64, 96, 128, 192, 256, 512, 59])
@pytest.mark.parametrize("num_splits", [1, 2, 3, 17, 133])
def test_combine_matches_float64_reference(num_splits, headdim, dtype):
    torch.random.manual_seed(num_splits * 1000 + headdim)
    for seqlen, strided in ((1, False), (113, True), (64, False)):
        out_partial, lse_partial = _combine_inputs(num_splits, 5, seqlen, 4, headdim, strided)
        out, lse = fai.flash_attn_combine(out_partial, lse_partial, out_dtype=dtype)
        _expect_combine_matches_reference(out, lse, out_partial, lse_partial, dtype)
        # FlashAttention-3's lse layout: (batch, heads, seqlen) transposed.
        assert lse.stride() == (4 * seqlen, 1, seqlen)
        # No split at all: zeros and -inf.
        assert bool((out[-1, -1, -1] == 0).all()) and lse[-1, -1, -1].item() == -float("inf")


@requires_hopper
def test_combine_into_out_opcheck_and_compile():
    out_partial, lse_partial = _combine_inputs(5, 2, 33, 3, 128, strided=True)
    out = torch.full((2, 33, 3, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
    result, lse = fai.flash_attn_combine(out_partial, lse_partial, out=out)
    assert result is out
    _expect_combine_matches_reference(out, lse, out_partial, lse_partial, torch.bfloat16)
    with pytest.raises(ValueError, match="out.dtype is torch.bfloat16 but out_dtype is torch.float16"):
        fai.flash_attn_combine(out_partial, lse_partial, out=out, out_dtype=torch.float16)
    with pytest.raises(ValueError, match=r"out must be \(batch, seqlen, heads, headdim\) = \(2, 33, 3, 128\)"):
        fai.flash_attn_combine(out_partial, lse_partial, out=out[:, :32])
    torch.library.opcheck(ops.combine.default, (out_partial, lse_partial, torch.bfloat16))
    torch.library.opcheck(ops.combine.default, (out_partial.contiguous(), lse_partial.contiguous(), None))
    step = lambda o, l: fai.flash_attn_combine(o, l, out_dtype=torch.float16)
    compiled = torch.compile(step, fullgraph=True)
    for got, expected in zip(compiled(out_partial, lse_partial), step(out_partial, lse_partial)):
        torch.testing.assert_close(got, expected, atol=0, rtol=0)


@requires_hopper
def test_combine_edge_cases():
    # +inf and NaN split lses (torch.logsumexp's answers, zero outputs), a head dim of 1,
    # empty problems, and the checks the operator makes before flash3.
    out_partial = torch.randn(3, 1, 2, 1, 1, device="cuda")
    lse_partial = torch.tensor([[1.0, float("inf")], [2.0, 0.5], [float("nan"), 0.5]], device="cuda")
    out, lse = fai.flash_attn_combine(out_partial, lse_partial.reshape(3, 1, 2, 1))
    assert lse[0, 0, 0].isnan() and lse[0, 1, 0].item() == float("inf")
    assert bool((out == 0).all())
    out_partial = torch.randn(4, 2, 3, 5, 1, device="cuda")
    lse_partial = torch.randn(4, 2, 3, 5, device="cuda")
    out, lse = fai.flash_attn_combine(out_partial, lse_partial, out_dtype=torch.float16)
    _expect_combine_matches_reference(out, lse, out_partial, lse_partial, torch.float16)
    for shape in ((2, 0, 7, 3, 64), (2, 3, 0, 3, 64), (2, 3, 7, 0, 64)):
        out, lse = fai.flash_attn_combine(torch.empty(shape, device="cuda"), torch.empty(shape[:4], device="cuda"))
        assert out.shape == shape[1:] and lse.shape == shape[1:4]
    good = torch.randn(2, 1, 4, 2, 64, device="cuda")
    with pytest.raises(ValueError, match=r"lse_partial must be \(num_splits, batch, seqlen, heads\)"):
        ops.combine(good, torch.randn(2, 1, 4, 3, device="cuda"))
    with pytest.raises(ValueError, match="out_partial must be torch.float32"):
        ops.combine(good.half(), torch.randn(2, 1, 4, 2, device="cuda"))
    with pytest.raises(ValueError, match="out_partial_stride\\[4\\] \\(headdim\\) = 2 must be 1"):
        ops.combine(good[..., ::2], torch.randn(2, 1, 4, 2, device="cuda"))
    with pytest.raises(NotImplementedError, match="headdim\\) = 2048 is not supported"):
        ops.combine(torch.randn(1, 1, 1, 1, 2048, device="cuda"), torch.randn(1, 1, 1, 1, device="cuda"))
    with pytest.raises(ValueError, match="out_partial is on the CPU"):
        ops.combine(good.cpu(), torch.randn(2, 1, 4, 2))


def _attention_in_a_window(q, k, v, causal, window, chunk=0, softcap=0.0):
    # float32 attention with FlashAttention's window_size (bottom-right aligned, -1 unbounded),
    # attention_chunk (a row sees only its diagonal's chunk of keys) and softcap.
    group = q.shape[2] // k.shape[2]
    k, v = (x.float().repeat_interleave(group, dim=2) for x in (k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k) / q.shape[-1] ** 0.5
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    sq, sk = q.shape[1], k.shape[1]
    diagonal = torch.arange(sq, device=q.device)[:, None] + sk - sq
    key = torch.arange(sk, device=q.device)[None, :]
    left, right = window
    hidden = torch.zeros(sq, sk, dtype=torch.bool, device=q.device)
    if left >= 0:
        hidden |= key < diagonal - left
    if causal or right >= 0:
        hidden |= key > diagonal + (0 if causal else right)
    if chunk > 0:
        start = torch.div(diagonal, chunk, rounding_mode="floor") * chunk
        hidden |= (key < start) | (key >= start + chunk)
    scores = scores.masked_fill(hidden, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.nan_to_num(torch.softmax(scores, dim=-1))  # rows that see no key: zeros
    return torch.einsum("bhqk,bkhd->bqhd", probs, v), lse.masked_fill(lse == float("-inf"), float("inf"))


def _expect_matches_float32(out, lse, want, want_lse, inputs):
    """out and lse against a float32 attention's, and the gradients of inputs through both;
    returns the gradient of out taken."""
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, want_lse, atol=1e-3, rtol=1e-4)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, inputs, g, retain_graph=True)  # (a caller's q * 4 feeds both graphs)
    ref = torch.autograd.grad(want, inputs, g.float())
    for a, b in zip(got, ref):  # (the float32 attention's gradients come back in the inputs' dtype)
        torch.testing.assert_close(a.float(), b.float(), atol=5e-2, rtol=5e-2)
    return g


@requires_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window, chunk", [((64, 0), 0), ((100, 30), 0), ((-1, 17), 0), ((0, 0), 0),
                                           ((-1, -1), 100), ((50, -1), 64), ((-1, -1), 5000)])
def test_sliding_window_and_chunk_match_a_float32_attention(causal, window, chunk):
    q, k, v = qkv(seqlen_q=300, seqlen_k=411, requires_grad=True)
    out, lse = fai.flash_attn_func(q, k, v, causal=causal, window_size=window, attention_chunk=chunk,
                                   return_attn_probs=True)
    want, want_lse = _attention_in_a_window(q, k, v, causal, window, chunk)
    _expect_matches_float32(out, lse, want, want_lse, (q, k, v))
    q, k, v, want = (x.detach() for x in (q, k, v, want))
    # FA3's tests pass the window as a tensor of two; varlen and the KV cache take it too.
    cu = torch.tensor([0, 300, 600], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 411, 822], dtype=torch.int32, device="cuda")
    packed = fai.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu_k, 300, 411,
                                        causal=causal, window_size=torch.tensor(window), attention_chunk=chunk)
    torch.testing.assert_close(packed.view_as(out).float(), want, atol=2e-2, rtol=2e-2)
    cached = fai.flash_attn_with_kvcache(q, k, v, cache_seqlens=411, causal=causal, window_size=window,
                                         attention_chunk=chunk)
    torch.testing.assert_close(cached.float(), want, atol=2e-2, rtol=2e-2)


@requires_hopper
@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)), (True, (100, 0))])
def test_softcap_matches_a_float32_attention(causal, window):
    q, k, v = qkv(seqlen_q=300, seqlen_k=411, requires_grad=True)
    q4 = q * 4  # scores of tens, where the cap bends them
    out, lse = fai.flash_attn_func(q4, k, v, causal=causal, window_size=window, softcap=5.0,
                                   return_attn_probs=True)
    want, want_lse = _attention_in_a_window(q4, k, v, causal, window, softcap=5.0)
    g = _expect_matches_float32(out, lse, want, want_lse, (q, k, v))
    # The varlen backward on the same sequences packed: the dense one's gradients (each
    # through a q * 4 of its own: a graph's first backward frees its saved tensors).
    dense = torch.autograd.grad(fai.flash_attn_func(q * 4, k, v, causal=causal, window_size=window, softcap=5.0),
                                (q, k, v), g)
    packed = fai.flash_attn_varlen_func((q * 4).flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1),
                                        torch.tensor([0, 300, 600], dtype=torch.int32, device="cuda"),
                                        torch.tensor([0, 411, 822], dtype=torch.int32, device="cuda"),
                                        300, 411, causal=causal, window_size=window, softcap=5.0)
    for a, b in zip(torch.autograd.grad(packed, (q, k, v), g.flatten(0, 1)), dense):
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)


@requires_hopper
def test_sliding_window_deterministic_backward_repeats_and_fp8_is_refused():
    q, k, v = qkv(seqlen_q=700, seqlen_k=900, requires_grad=True)
    g = torch.randn_like(q)
    grads = []
    for _ in range(2):
        out = fai.flash_attn_func(q, k, v, window_size=(200, 50), deterministic=True)
        grads.append(torch.autograd.grad(out, (q, k, v), g))
    for a, b in zip(*grads):
        assert torch.equal(a, b)
    with pytest.raises(NotImplementedError, match="window_size, attention_chunk or softcap with float8_e4m3fn"):
        fai.flash_attn_func(*(x.detach().to(torch.float8_e4m3fn) for x in (q, k, v)), window_size=(64, 0))


def _attention_with_sinks(q, k, v, sinks, causal):
    # float32 attention with gpt-oss's sinks: one more logit per row, no value.
    group = q.shape[2] // k.shape[2]
    k, v = (x.float().repeat_interleave(group, dim=2) for x in (k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k) / q.shape[-1] ** 0.5
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        hidden = torch.ones(sq, sk, dtype=torch.bool, device=q.device).triu(sk - sq + 1)
        scores = scores.masked_fill(hidden, float("-inf"))
    sink = sinks.float().view(1, -1, 1, 1).expand(scores.shape[0], -1, scores.shape[2], 1)
    logits = torch.cat([scores, sink], dim=-1)
    probs = torch.softmax(logits, dim=-1)[..., :-1]
    return torch.einsum("bhqk,bkhd->bqhd", probs, v), torch.logsumexp(logits, dim=-1)


@requires_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_sinks_match_a_float32_attention(causal):
    q, k, v = qkv(seqlen_q=300, seqlen_k=211, requires_grad=True)
    sinks = torch.randn(q.shape[2], device="cuda") * 2
    out, lse = fai.flash_attn_func(q, k, v, causal=causal, sinks=sinks, return_attn_probs=True)
    want, want_lse = _attention_with_sinks(q, k, v, sinks, causal)
    g = _expect_matches_float32(out, lse, want, want_lse, (q, k, v))
    # The sinks' own gradient (bwd_sinks), against the float32 attention's.
    trained = sinks.clone().requires_grad_()
    out = fai.flash_attn_func(q, k, v, causal=causal, sinks=trained)
    (dsinks,) = torch.autograd.grad(out, (trained,), g)
    want, _ = _attention_with_sinks(q, k, v, trained, causal)
    (want_dsinks,) = torch.autograd.grad(want, (trained,), g.float())
    torch.testing.assert_close(dsinks, want_dsinks, atol=5e-2, rtol=5e-2)


def test_window_given_as_a_tensor_needs_no_value_while_traced():
    # FlashAttention-3's varlen tests pass window_size = torch.randint(0, seqlen_k, (2,)): traced
    # with fake tensors (torch.compile, AOT autograd), its value is unknown, so the operators
    # that take it (flash3_window::*) read it only where they run.
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q = torch.empty(100, 8, 128, dtype=torch.bfloat16)
        k = torch.empty(300, 2, 128, dtype=torch.bfloat16)
        cu = torch.empty(3, dtype=torch.int32)
        window = torch.empty(2, dtype=torch.int64)
        out, lse = fai.flash_attn_varlen_func(q, k, k, cu, cu, 100, 300, window_size=window,
                                              return_attn_probs=True)
        assert out.shape == q.shape and lse.shape == (8, 100)
        out2 = fai.flash_attn_varlen_func(q, k, k, cu, cu, 100, 300,
                                          window_size=(window[0], window[1]))
        assert out2.shape == q.shape


@requires_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_window_tensor_matches_ints_and_passes_the_autograd_check(causal):
    torch.manual_seed(0)
    lengths = [77, 200, 1]
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device="cuda")
    total = int(cu[-1])
    make = lambda h: torch.randn(total, h, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    q, k, v = make(4), make(2), make(2)
    dout = torch.randn(total, 4, 128, device="cuda", dtype=torch.bfloat16)
    window = torch.tensor([30, 5])
    args = (q, k, v, cu, cu, max(lengths), max(lengths))
    results = []
    for window_size in ((30, 5), window, (window[0], window[1])):
        out = fai.flash_attn_varlen_func(*args, causal=causal, window_size=window_size)
        results.append((out, *torch.autograd.grad(out, (q, k, v), dout)))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)
    # FlashAttention-3's autograd check (FLASH_ATTENTION_ENABLE_AUTOGRAD_CHECK), which traced
    # int(window[0]) into DataDependentOutputException before.
    from torch.testing._internal.optests.generate_tests import safe_aot_autograd_check
    kwargs = dict(causal=causal, window_size=window)
    for dynamic in (False, True):
        safe_aot_autograd_check(fai.flash_attn_varlen_func, args, kwargs, dynamic=dynamic)
