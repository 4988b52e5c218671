#!/usr/bin/env python3
"""A packed ragged batch (flash_attn_varlen_func) against the padded batch of the same
sequences (flash_attn_func at the longest length), in useful TFLOP/s: the FLOPs of the real
sequences only, for both (issue 24's bar: packed at least as fast; the padded call attends
over the padding too, which only a timing may ignore). Each figure is the
median of --iters CUDA-event timings after --warmup calls, the two taking turns.

    python3 bench/varlen.py [--headdim 128] [--causal] [--backward] [--seed 0]

--backward times the backward alone instead (torch.ops.flash3.bwd_varlen against
torch.ops.flash3.bwd on the padded batch, each from its own forward's out and log-sum-exp;
FLOPs 2.5x the forward's).

Batches: uniform lengths 1k-4k, lengths 64-8k drawn log-uniformly, and one long sequence
among many short ones. Exit codes: 0 done; 2 bad command line; 3 no CUDA device.
"""
import argparse
import itertools
import math
import random
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from flash3.flash_attn_interface import flash_attn_func, flash_attn_varlen_func, ops  # noqa: E402

HIDDEN = 2048


def batches(rng):
    yield "uniform 1k-4k x 8", [rng.randint(1024, 4096) for _ in range(8)]
    yield "log-uniform 64-8k x 16", [int(math.exp(rng.uniform(math.log(64), math.log(8192)))) for _ in range(16)]
    yield "one 8k + 63 x 256", [8192] + [256] * 63


def median_ms(calls, warmup, iters):
    for call in calls.values():
        for _ in range(warmup):
            call()
    pairs = {name: [] for name in calls}
    for _ in range(iters):
        for name, call in calls.items():
            start, stop = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            call()
            stop.record()
            pairs[name].append((start, stop))
    torch.cuda.synchronize()
    return {name: statistics.median(a.elapsed_time(b) for a, b in p) for name, p in pairs.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--backward", action="store_true", help="time the backward alone")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("varlen.py: no CUDA device", file=sys.stderr)
        return 3
    heads, d = HIDDEN // args.headdim, args.headdim
    print(f"{torch.cuda.get_device_name()}: useful TFLOP/s, head dim {d}, {heads} heads, "
          f"{'causal' if args.causal else 'non-causal'}, bf16, {'backward' if args.backward else 'forward'}")
    print(f"{'batch':>24} {'tokens':>8} {'packed':>8} {'padded':>8} {'ratio':>6}")
    rng = random.Random(args.seed)
    for label, lengths in batches(rng):
        total, longest = sum(lengths), max(lengths)
        flops = sum(4 * heads * n * n * d / (2 if args.causal else 1) for n in lengths)
        flops *= 2.5 if args.backward else 1.0
        q, k, v = (torch.randn(total, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device="cuda")
        padded = [torch.zeros(len(lengths), longest, heads, d, device="cuda", dtype=torch.bfloat16)
                  for _ in range(3)]
        for b, (start, n) in enumerate(zip(cu.tolist(), lengths)):
            for dst, src in zip(padded, (q, k, v)):
                dst[b, :n] = src[start:start + n]
        if args.backward:
            out_v, lse_v = ops.fwd_varlen(q, k, v, cu, cu, longest, None, args.causal)
            out_p, lse_p = ops.fwd(*padded, None, args.causal)
            dout_v, dout_p = torch.randn_like(out_v), torch.randn_like(out_p)
            calls = {
                "packed": lambda: ops.bwd_varlen(dout_v, q, k, v, out_v, lse_v, cu, cu, longest, None,
                                                 args.causal),
                "padded": lambda: ops.bwd(dout_p, *padded, out_p, lse_p, None, args.causal),
            }
        else:
            calls = {
                "packed": lambda: flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=args.causal),
                "padded": lambda: flash_attn_func(*padded, causal=args.causal),
            }
        ms = median_ms(calls, args.warmup, args.iters)
        tf = {name: flops / (t * 1e-3) / 1e12 for name, t in ms.items()}
        print(f"{label:>24} {total:8d} {tf['packed']:8.0f} {tf['padded']:8.0f} {tf['packed'] / tf['padded']:6.2f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
