#!/usr/bin/env python3
"""Host (enqueue) time per call of flash3 and PyTorch SDPA's cuDNN and FlashAttention-2
backends, in one process, forward and backward.

Each figure is CPU time per call while the GPU is kept busy by a spin kernel queued
ahead, so no call waits for the GPU: what a training or serving loop pays on the host
before the GPU can be kept full. The backward is each library's own, through
torch.autograd.grad of its own forward's output (the same autograd overhead for all).
A figure is the median over --rounds rounds of --calls calls; a round whose spin kernel
had finished before its last call is reported as not queued ahead (and not counted).

    python3 bench/host_time.py [--calls 200] [--rounds 5]

Exit codes: 0 done; 2 bad command line; 3 no CUDA device.
"""
import argparse
import contextlib
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flash3

# (batch, seqlen, heads, headdim, causal): a tiny problem and a mid-size one.
PROBLEMS = [(1, 128, 8, 128, True), (2, 1000, 16, 128, True)]
SPIN_CYCLES = 2_000_000_000  # about a second at the H200's clock: longer than any round


def sdpa(q, k, v, causal):
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal).transpose(1, 2)


BACKENDS = {
    "flash3": (lambda q, k, v, c: flash3.flash_attn_func(q, k, v, causal=c), contextlib.nullcontext),
    "cuDNN": (sdpa, lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)),
    "FA2": (sdpa, lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)),
}


def host_us(call, calls, rounds):
    """Median host microseconds per call over rounds with the GPU busy; None if no round
    stayed queued ahead."""
    for _ in range(5):
        call()  # warm-up: module loads, allocator blocks, cached plans
    torch.cuda.synchronize()
    per_call = []
    for _ in range(rounds):
        torch.cuda._sleep(SPIN_CYCLES)
        spin_done = torch.cuda.Event()
        spin_done.record()
        start = time.perf_counter()
        for _ in range(calls):
            call()
        elapsed = time.perf_counter() - start
        if not spin_done.query():  # the GPU was still busy with the spin: queued ahead
            per_call.append(elapsed / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(per_call) if per_call else None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("host_time.py: no CUDA device", file=sys.stderr)
        return 3
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, flash3 {flash3.__version__}: "
          f"host microseconds per call, GPU queued ahead, median of {args.rounds} x {args.calls} calls")
    print(f"{'problem':>24} {'direction':>9} " + " ".join(f"{name:>8}" for name in BACKENDS))
    for batch, seqlen, heads, headdim, causal in PROBLEMS:
        shape = (batch, seqlen, heads, headdim)
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        label = f"b{batch} s{seqlen} h{heads} d{headdim}{' causal' if causal else ''}"
        for direction in ("forward", "backward"):
            row = []
            for fn, context in BACKENDS.values():
                with context(), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    try:
                        if direction == "forward":
                            call = lambda fn=fn: fn(q, k, v, causal)
                        else:
                            out = fn(q, k, v, causal)
                            call = lambda out=out: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                        us = host_us(call, args.calls, args.rounds)
                    except RuntimeError:
                        us = None
                row.append(f"{us:8.1f}" if us is not None else f"{'n/a':>8}")
            print(f"{label:>24} {direction:>9} " + " ".join(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
