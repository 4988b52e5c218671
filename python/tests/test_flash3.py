"""flash_attn_func against a float64 reference; the GPU cases need PyTorch and a Hopper GPU.

Tolerance (as FlashAttention's tests): flash3's error against the float64 reference may
be at most twice that of plain attention computed in the input dtype, plus an atol of
two roundings of the output.
"""
import pytest

torch = pytest.importorskip("torch")

from flash3 import flash_attn_func  # noqa: E402
from flash3.flash_attn_interface import _forward  # noqa: E402

requires_hopper = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs a Hopper (sm_90) GPU",
)
DTYPES = [torch.float16, torch.bfloat16]
# float32 LSE from float32 accumulators, against float64; values are about log(seqlen_k).
LSE_TOL = 1e-3
# batch, seqlen_q, seqlen_k, heads, heads_k, headdim
SHAPES = [
    (2, 128, 128, 4, 4, 128),
    (1, 1000, 1000, 3, 3, 64),  # seqlen not a multiple of the tile
    (2, 300, 777, 4, 2, 256),  # GQA, seqlen_q < seqlen_k
    (1, 777, 300, 8, 1, 128),  # MQA; causal rows before seqlen_q - seqlen_k see no key
]


def scores_and_values(q, k, v, causal, dtype):
    """Scaled, masked scores (b, h, q, k) of q and k in `dtype` (computed in float32 at
    least; GQA's k and v repeated per query head) and the repeated v."""
    acc = torch.promote_types(dtype, torch.float32)
    k, v = (x.repeat_interleave(q.shape[2] // k.shape[2], dim=2) for x in (k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k).to(acc) * q.shape[-1] ** -0.5
    if causal:
        seqlen_q, seqlen_k = q.shape[1], k.shape[1]
        row = torch.arange(seqlen_q, device=q.device)[:, None]
        col = torch.arange(seqlen_k, device=q.device)[None, :]
        scores = scores.masked_fill(col > row + seqlen_k - seqlen_q, float("-inf"))
    return scores, v


def attention(q, k, v, causal, dtype):
    """Plain attention in `dtype` (softmax in float32 at least): (out, lse)."""
    q, k, v = (x.to(dtype) for x in (q, k, v))
    scores, v = scores_and_values(q, k, v, causal, dtype)
    lse = torch.logsumexp(scores, dim=-1)
    p = torch.exp(scores - lse[..., None]).nan_to_num(0.0)  # rows with no key: zeros
    out = torch.einsum("bhqk,bkhd->bqhd", p.to(dtype), v)
    return out, lse.masked_fill(lse == float("-inf"), float("inf"))


def assert_matches_reference(q, k, v, causal, out, lse):
    ref, ref_lse = attention(q, k, v, causal, torch.float64)
    plain, _ = attention(q, k, v, causal, q.dtype)
    rounded = ref.to(q.dtype)
    atol = 2 * (rounded + 0.3 - 0.3 - rounded).abs().max().item()
    error = (out.double() - ref).abs().max().item()
    plain_error = (plain.double() - ref).abs().max().item()
    assert error <= 2 * plain_error + atol, f"flash3 {error:.3g}, plain {plain_error:.3g}"
    torch.testing.assert_close(lse, ref_lse.float(), atol=LSE_TOL, rtol=LSE_TOL)


def qkv(batch, seqlen_q, seqlen_k, heads, heads_k, headdim, dtype):
    make = lambda seqlen, h: torch.randn(batch, seqlen, h, headdim, device="cuda", dtype=dtype)  # noqa: E731
    return make(seqlen_q, heads), make(seqlen_k, heads_k), make(seqlen_k, heads_k)


def call(*args, **kwargs):
    """flash_attn_func, skipping kernels that this build of the library leaves out."""
    try:
        return flash_attn_func(*args, **kwargs)
    except NotImplementedError as e:
        if "not in this build" in str(e):
            pytest.skip(str(e))
        raise


@requires_hopper
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_reference(shape, causal, dtype):
    q, k, v = qkv(*shape, dtype)
    out, lse = call(q, k, v, causal=causal, return_attn_probs=True)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == torch.float32
    assert_matches_reference(q, k, v, causal, out, lse)


@requires_hopper
def test_returns_only_out_by_default():
    q, k, v = qkv(*SHAPES[0], torch.bfloat16)
    assert isinstance(call(q, k, v), torch.Tensor)


@requires_hopper
@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_qkv(dtype):
    qkv_packed = torch.randn(2, 333, 3, 4, 128, device="cuda", dtype=dtype)
    q, k, v = qkv_packed.unbind(2)  # strided views: seqlen stride 3 * heads * headdim
    out, lse = call(q, k, v, causal=True, return_attn_probs=True)
    assert_matches_reference(q, k, v, True, out, lse)


@requires_hopper
def test_writes_every_element():
    q, k, v = qkv(*SHAPES[-1], torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("nan"), device="cuda")
    _forward(q, k, v, None, True, out, lse)
    assert_matches_reference(q, k, v, True, out, lse)


@requires_hopper
def test_runs_on_the_current_stream():
    q, k, v = qkv(*SHAPES[0], torch.bfloat16)
    expected = call(q, k, v)
    late_q = torch.zeros_like(q)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(100_000_000)  # q arrives late: a call on another stream would miss it
        late_q.copy_(q)
        out = call(late_q, k, v)
    stream.synchronize()
    torch.testing.assert_close(out, expected)


@requires_hopper
@pytest.mark.parametrize(
    "mutate, error, message",
    [
        (lambda q, k, v: (torch.randn(*q.shape[:3], 256, device="cuda", dtype=q.dtype)[..., ::2], k, v),
         ValueError, r"q\.stride\[3\] \(headdim\) = 2"),
        (lambda q, k, v: (q, k[..., :64], v), ValueError, r"k\.shape\[3\] \(headdim\) = 64 differs"),
        (lambda q, k, v: (q[:, :, :3], k[:, :, :2], v[:, :, :2]), ValueError, "not a multiple"),
        (lambda q, k, v: (q.float(), k.float(), v.float()), ValueError, r"q\.dtype is float32"),
        (lambda q, k, v: (q[..., :80], k[..., :80], v[..., :80]), NotImplementedError, "headdim = 80"),
        (lambda q, k, v: (q.double(), k, v), ValueError, r"q\.dtype is torch\.float64"),
        (lambda q, k, v: (q[0], k, v), ValueError, "q must be a 4-d"),
        (lambda q, k, v: (q, k.cpu(), v), ValueError, "k is on cpu but q is on cuda"),
    ],
)
def test_bad_input_raises_the_library_message(mutate, error, message):
    q, k, v = mutate(*qkv(*SHAPES[0], torch.bfloat16))
    with pytest.raises(error, match=message):
        flash_attn_func(q, k, v)


def test_cpu_tensors_get_a_clear_refusal():
    q = torch.randn(1, 128, 2, 64)
    no_gpu = "" if torch.cuda.is_available() else ", and this machine has no CUDA device"
    with pytest.raises(ValueError, match=f"q is on the CPU; flash3 runs on a Hopper GPU \\(H100, H200\\){no_gpu}"):
        flash_attn_func(q, q, q)


@pytest.mark.parametrize(
    "name, value",
    [
        ("qv", torch.zeros(1)),
        ("sm_margin", 8),
        ("softmax_scale", 0.0),
    ],
)
def test_unsupported_arguments_are_named(name, value):
    q = torch.randn(1, 128, 2, 64)
    with pytest.raises(NotImplementedError, match=f"flash3: {name}="):
        flash_attn_func(q, q, q, **{name: value})


@pytest.mark.parametrize("name", ["q_descale", "k_descale", "v_descale"])
def test_descales_are_for_fp8_inputs_only(name):
    q = torch.randn(1, 128, 2, 64)
    with pytest.raises(ValueError, match="float8_e4m3fn inputs only"):
        flash_attn_func(q, q, q, **{name: torch.ones(1, 2)})


@requires_hopper
@pytest.mark.parametrize("first, second", [(128, 64), (64, 128), (256, 64), (64, 256), (128, 256), (256, 128)])
def test_tail_split_workspace_shared_by_head_dims(first, second):
    # Non-causal, long enough for the long-sequence kernels, and a last wave of tiles that
    # is split in pieces (src/sm90/fwd/tail_split.hpp): the pieces meet in the stream's
    # workspace, whose flags must be zero whatever head dim used it before.
    stream = torch.cuda.Stream()
    inputs = {d: qkv(2, 3000, 3000, 13, 13, d, torch.bfloat16) for d in (first, second)}
    torch.cuda.current_stream().synchronize()
    with torch.cuda.stream(stream):
        for _ in range(3):
            call(*inputs[first])
            after_other = call(*inputs[second])
    alone_stream = torch.cuda.Stream()  # a workspace only `second` uses
    alone_stream.wait_stream(stream)
    with torch.cuda.stream(alone_stream):
        alone = call(*inputs[second])
    alone_stream.synchronize()
    assert torch.equal(after_other, alone)
