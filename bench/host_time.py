#!/usr/bin/env python3
"""Host (enqueue) time per call of flash3 and PyTorch SDPA's cuDNN and FlashAttention-2
backends, in one process, forward and backward.

Each figure is CPU time per call while the GPU is kept busy by a spin kernel queued
ahead, so no call waits for the GPU: what a training or serving loop pays on the host
before the GPU can be kept full. The backward is each library's own, through
torch.autograd.grad of its own forward's output (the same autograd overhead for all).
A figure is the median over --rounds rounds of --calls calls, the libraries taking turns
round by round; a round whose spin kernel had finished before its last call is not
queued ahead and not counted.

    python3 bench/host_time.py [--calls 200] [--rounds 9] [--parts]

--parts adds where flash3's time goes on the first problem: its operators called directly
(no autograd), three torch.empty_like, and torch.autograd.grad of flash3's and cuDNN's
outputs (the autograd engine's share).

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
SPIN_CYCLES = 400_000_000  # about 0.2 s at the H200's clock: longer than any round of calls


def sdpa(q, k, v, causal):
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal).transpose(1, 2)


BACKENDS = {
    "flash3": (lambda q, k, v, c: flash3.flash_attn_func(q, k, v, causal=c), contextlib.nullcontext),
    "cuDNN": (sdpa, lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)),
    "FA2": (sdpa, lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)),
}


def one_round(call, calls):
    """Host microseconds per call of `calls` calls with the GPU busy; None if the GPU ran
    dry before the last call (not queued ahead)."""
    torch.cuda._sleep(SPIN_CYCLES)
    spin_done = torch.cuda.Event()
    spin_done.record()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    elapsed = time.perf_counter() - start
    queued_ahead = not spin_done.query()
    torch.cuda.synchronize()
    return elapsed / calls * 1e6 if queued_ahead else None


def host_us(named_calls, calls, rounds):
    """{name: median host microseconds per call} for {name: (call, context)}, the callers
    taking turns round by round (so that a drift of the machine's speed hits them alike);
    None for one that raised RuntimeError or never stayed queued ahead."""
    live, per_call = {}, {name: [] for name in named_calls}
    for name, (call, context) in named_calls.items():
        try:
            with context():
                for _ in range(5):
                    call()  # warm-up: module loads, allocator blocks, cached plans
            torch.cuda.synchronize()
            live[name] = (call, context)
        except RuntimeError:
            pass
    for _ in range(rounds):
        for name, (call, context) in live.items():
            with context():
                us = one_round(call, calls)
            if us is not None:
                per_call[name].append(us)
    return {name: statistics.median(v) if v else None for name, v in per_call.items()}


def shown(us):
    return f"{us:8.1f}" if us is not None else f"{'n/a':>8}"


def parts(calls, rounds):
    """Host microseconds of flash3's operators alone and of the pieces around them."""
    from flash3.flash_attn_interface import ops

    batch, seqlen, heads, headdim, causal = PROBLEMS[0]
    q, k, v = (torch.randn(batch, seqlen, heads, headdim, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)
    qd, kd, vd = (x.detach() for x in (q, k, v))
    out, lse = ops.fwd(qd, kd, vd, None, causal)
    grads = [torch.empty_like(x) for x in (qd, kd, vd)]
    flash3_out = flash3.flash_attn_func(q, k, v, causal=causal)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        cudnn_out = sdpa(q, k, v, causal)
    rows = {
        "ops.fwd_out (no autograd)": lambda: ops.fwd_out(qd, kd, vd, out, lse, None, causal),
        "ops.fwd (no autograd)": lambda: ops.fwd(qd, kd, vd, None, causal),
        "ops.bwd": lambda: ops.bwd(dout, qd, kd, vd, out, lse, None, causal, False),
        "ops.bwd_out": lambda: ops.bwd_out(dout, qd, kd, vd, out, lse, *grads, None, causal, False),
        "3 x torch.empty_like": lambda: [torch.empty_like(x) for x in (qd, kd, vd)],
        "autograd.grad, flash3": lambda: torch.autograd.grad(flash3_out, (q, k, v), dout, retain_graph=True),
        "autograd.grad, cuDNN": lambda: torch.autograd.grad(cudnn_out, (q, k, v), dout, retain_graph=True),
    }
    print(f"where flash3's time goes, b{batch} s{seqlen} h{heads} d{headdim}{' causal' if causal else ''}:")
    results = host_us({name: (call, contextlib.nullcontext) for name, call in rows.items()}, calls, rounds)
    for name, us in results.items():
        print(f"{name:>32} {shown(us)}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--parts", action="store_true", help="also time flash3's operators alone")
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
            named = {}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for name, (fn, context) in BACKENDS.items():
                    if direction == "forward":
                        named[name] = (lambda fn=fn: fn(q, k, v, causal), context)
                        continue
                    try:
                        with context():
                            out = fn(q, k, v, causal)
                    except RuntimeError:
                        continue
                    named[name] = (lambda out=out: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True),
                                   context)
                results = host_us(named, args.calls, args.rounds)
            row = [shown(results.get(name)) for name in BACKENDS]
            print(f"{label:>24} {direction:>9} " + " ".join(row), flush=True)
    if args.parts:
        parts(args.calls, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
