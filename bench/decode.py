#!/usr/bin/env python3
"""Decode-shaped attention: a few queries against a long KV cache, where the work is bound
by reading K and V from HBM. Prints the K/V bandwidth (bytes of K and V read per second)
of flash3 and of PyTorch SDPA's cuDNN and FlashAttention-2 backends, in one process,
beside a device-to-device copy's bandwidth (bytes read and written per second) measured
in the same run (issue 24's yardstick: decode at >= 80% of the copy). flash3 runs three
ways: flash_attn_func (flash3), flash_attn_with_kvcache on the contiguous cache
(f3cache) and on the same bytes as a paged pool of 256-key pages read through a
shuffled page table (f3paged).

Each figure is the median of --iters CUDA-event timings after --warmup calls. K and V are
rotated over enough copies to exceed the L2 (60 MB on an H200), so every call reads them
from HBM. No causal mask: with one query a bottom-right causal mask sees every key, and
SDPA's is_causal is top-left aligned, so all backends run unmasked (the bytes are the same).

    python3 bench/decode.py                     # batch 8, 1 query, cache 8k and 32k, GQA 32/8, d128
    python3 bench/decode.py --all               # the issue's grid (batch 1-128, 1-8 queries, 1k-128k)
    python3 bench/decode.py --batch 8 --seqlen-q 1 --cache 8192 --heads 32/8 --headdim 128

Exit codes: 0 done; 2 bad command line; 3 no CUDA device.
"""
import argparse
import contextlib
import itertools
import statistics
import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import flash3  # noqa: E402
from flash3.flash_attn_interface import flash_attn_with_kvcache  # noqa: E402

L2_BYTES = 60 << 20
MAX_KV_BYTES = 48 << 30  # one set of K and V; larger cells are skipped


def flash3_decode(q, k, v):
    return flash3.flash_attn_func(q, k, v)


PAGE_SIZE = 256
_tables = {}


def _cache_args(q, k):
    """(cache_seqlens, page_table) for a cache of k's shape: every slot used; the pages of
    each batch in a shuffled order (fixed per shape, so not timed)."""
    key = (k.shape, k.device)
    if key not in _tables:
        batch, cache = k.shape[0], k.shape[1]
        pages = cache // PAGE_SIZE
        lengths = torch.full((batch,), cache, dtype=torch.int32, device=k.device)
        order = torch.randperm(batch * pages, device=k.device, dtype=torch.int32).reshape(batch, pages)
        _tables[key] = (lengths, order.contiguous())
    return _tables[key]


def flash3_kvcache(q, k, v):
    lengths, _ = _cache_args(q, k)
    return flash_attn_with_kvcache(q, k, v, cache_seqlens=lengths)


def flash3_paged(q, k, v):
    """The same bytes as pages of PAGE_SIZE keys in a pool, read through a shuffled table."""
    lengths, table = _cache_args(q, k)
    pool_k = k.view(-1, PAGE_SIZE, k.shape[2], k.shape[3])
    pool_v = v.view(-1, PAGE_SIZE, v.shape[2], v.shape[3])
    return flash_attn_with_kvcache(q, pool_k, pool_v, cache_seqlens=lengths, page_table=table)


def sdpa_decode(q, k, v):
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True).transpose(1, 2)


BACKENDS = {
    "flash3": (flash3_decode, contextlib.nullcontext),
    "f3cache": (flash3_kvcache, contextlib.nullcontext),
    "f3paged": (flash3_paged, contextlib.nullcontext),
    "cuDNN": (sdpa_decode, lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)),
    "FA2": (sdpa_decode, lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)),
}


def median_ms(call, warmup, iters):
    for _ in range(warmup):
        call()
    pairs = []
    for _ in range(iters):
        start, stop = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        call()
        stop.record()
        pairs.append((start, stop))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in pairs)


def copy_gbps(nbytes, warmup, iters):
    """A device-to-device copy of nbytes: (bytes read + bytes written) / time, GB/s."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), warmup, iters)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def run_cell(batch, seqlen_q, cache, heads_q, heads_k, headdim, dtype, args, reasons):
    kv_bytes = 2 * batch * cache * heads_k * headdim * torch.finfo(dtype).bits // 8
    if kv_bytes > MAX_KV_BYTES:
        return None
    copies = max(1, min(16, -(-2 * L2_BYTES // kv_bytes)))  # enough to leave the L2 behind
    q = torch.randn(batch, seqlen_q, heads_q, headdim, device="cuda", dtype=dtype)
    kvs = [tuple(torch.randn(batch, cache, heads_k, headdim, device="cuda", dtype=dtype) for _ in range(2))
           for _ in range(copies)]
    gbps = {}
    for name, (fn, context) in BACKENDS.items():
        turn = itertools.cycle(kvs)

        def call(fn=fn):
            k, v = next(turn)
            return fn(q, k, v)

        try:
            with context(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ms = median_ms(call, args.warmup, args.iters)
            gbps[name] = kv_bytes / (ms * 1e-3) / 1e9
        except RuntimeError as e:  # a backend that cannot run the shape; flash3's refusals too
            reasons.add(f"{name}: {str(e).splitlines()[0]}")
            gbps[name] = None
    del kvs
    return {"batch": batch, "seqlen_q": seqlen_q, "cache": cache, "heads_q": heads_q, "heads_k": heads_k,
            "headdim": headdim, "kv_bytes": kv_bytes, "gbps": gbps}


def heads_list(text):
    pairs = []
    for item in text.split(","):
        q, k = item.split("/")
        pairs.append((int(q), int(k)))
    return pairs


def int_list(text):
    return [int(x) for x in text.split(",")]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int_list, default=[8])
    parser.add_argument("--seqlen-q", type=int_list, default=[1])
    parser.add_argument("--cache", type=int_list, default=[8192, 32768])
    parser.add_argument("--heads", type=heads_list, default=[(32, 8)], help="heads_q/heads_k, comma-separated")
    parser.add_argument("--headdim", type=int_list, default=[128])
    parser.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    parser.add_argument("--all", action="store_true", help="the issue's grid")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=30)
    args = parser.parse_args()
    if args.all:
        args.batch, args.seqlen_q = [1, 8, 32, 128], [1, 4, 8]
        args.cache, args.heads, args.headdim = [1024, 8192, 32768, 131072], [(32, 8), (8, 1)], [64, 128, 256]
    if not torch.cuda.is_available():
        print("decode.py: no CUDA device", file=sys.stderr)
        return 3
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    copy = copy_gbps(1 << 30, args.warmup, args.iters)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}: "
          f"K/V GB/s read, median of {args.iters} calls; device copy {copy:.0f} GB/s (read + written, 1 GiB)")
    names = list(BACKENDS)
    header = ["batch", "q", "cache", "heads", "hdim", "KV MB"] + names + ["f3/copy"]
    print(" ".join(h.rjust(8) for h in header))
    reasons = set()
    for batch, seqlen_q, cache, (heads_q, heads_k), headdim in itertools.product(
            args.batch, args.seqlen_q, args.cache, args.heads, args.headdim):
        r = run_cell(batch, seqlen_q, cache, heads_q, heads_k, headdim, dtype, args, reasons)
        if r is None:
            continue
        g = r["gbps"]
        cells = [str(batch), str(seqlen_q), str(cache), f"{heads_q}/{heads_k}", str(headdim),
                 f"{r['kv_bytes'] / 1e6:.0f}"] + [f"{g[n]:.0f}" if g[n] else "n/a" for n in names]
        cells.append(f"{g['flash3'] / copy:.2f}" if g["flash3"] else "n/a")
        print(" ".join(c.rjust(8) for c in cells), flush=True)
    for reason in sorted(reasons):
        print(f"n/a: {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
