#!/usr/bin/env python3
"""flash3 beside PyTorch SDPA's cuDNN and FlashAttention-2 backends, in one process.

The grid of shared/TARGETS.md: batch x seqlen = 16384 tokens, hidden 2048 (heads =
2048 / headdim), headdim 64/128/256, causal and not, fp16/bf16. In each cell the three
backends run on the same random normal inputs (SDPA on transposed views of them); each
figure is the median of --iters CUDA-event timings after --warmup calls, and the backends
take turns in TIMING_ROUNDS rounds (the first one rotating), so that a change of clock
(the power cap after a long cell) falls on all of them alike. Inputs are not rotated
between calls: q, k and v take 64 MiB each, more than the L2 together, so what a call
finds there from the previous one is small.

Each cell also prints max |out - cuDNN's out| for flash3 and for FA2; a flash3 difference
over twice FA2's plus DIFF_ULPS roundings of the largest output (or a NaN) is marked '!'
and makes the exit code 1, so a fast wrong kernel cannot pass. A backend that cannot run
prints n/a (the reasons follow the table).

With --backward, each cell also gives the peak device memory of one backward call beyond what
was allocated before it (MiB, torch.cuda.max_memory_allocated; the inputs, out and dout are
allocated before), for flash3 and cuDNN, and flash3's bound: the gradients, the fp32 dQ
accumulator and two fp32 row arrays (seqlen rounded up to 128), plus 1 MiB; flash3 over it is
marked '!' and makes the exit code 1.

    python3 bench/compare.py --dtype bf16 --json out.json --markdown out.md --plot out.png

Exit codes: 0 done; 1 a flash3 output differs from cuDNN's or its backward passes its memory
bound (marked '!'); 2 bad command line (argparse); 3 no CUDA device.
"""
import argparse
import contextlib
import datetime
import itertools
import json
import math
import statistics
import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import flash3  # noqa: E402

TOKENS, HIDDEN = 16384, 2048
SEQLENS = [512, 1024, 2048, 4096, 8192, 16384]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# Slack on top of twice FA2's difference: two correct kernels may round the largest
# output (up to ~5 in causal rows that see few keys) to neighbouring values, each way.
DIFF_ULPS = 2
HEADER = ["dtype", "hdim", "causal", "seqlen", "flash3", "cuDNN", "FA2", "f3/cuDNN", "f3/FA2", "diff f3", "diff FA2"]
# --backward: peak MiB of a backward call beyond what it found allocated (flash3, cuDNN), flash3's bound.
HEADER_MEMORY = ["MiB f3", "MiB cuDNN", "bound"]


def flash3_attention(q, k, v, causal):
    return flash3.flash_attn_func(q, k, v, causal=causal)


def sdpa_attention(q, k, v, causal):
    # seqlen_q == seqlen_k, so SDPA's top-left causal mask is flash3's bottom-right one.
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal).transpose(1, 2)


# name -> (function, context it runs in)
BACKENDS = {
    "flash3": (flash3_attention, contextlib.nullcontext),
    "cuDNN": (sdpa_attention, lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)),
    "FA2": (sdpa_attention, lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)),
}


TIMING_ROUNDS = 4


def median_ms(calls, warmup, iters):
    """calls: name -> (call, context it runs in). The median time of each call in ms."""
    if not calls:  # no backend could run this cell
        return {}
    for call, context in calls.values():
        with context():
            for _ in range(warmup):
                call()
    names = list(calls)
    events = {name: [] for name in names}
    for r in range(TIMING_ROUNDS):
        count = iters // TIMING_ROUNDS + (r < iters % TIMING_ROUNDS)
        for name in names[r % len(names):] + names[:r % len(names)]:
            call, context = calls[name]
            with context():
                for _ in range(count):
                    start, stop = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                    start.record()
                    call()
                    stop.record()
                    events[name].append((start, stop))
    torch.cuda.synchronize()
    return {name: statistics.median(a.elapsed_time(b) for a, b in pairs) for name, pairs in events.items()}


def peak_mib(call, context):
    """The peak device memory one call allocates beyond what was allocated before it, in MiB."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with context(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        call()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def backward_bound_mib(q, k, v):
    """flash3's backward memory bound beyond its inputs: dq, dk, dv, the fp32 dQ accumulator and
    two fp32 row arrays (log-sum-exp, D) over seqlen rounded up to 128, and 1 MiB for the rest."""
    batch, seqlen, heads, headdim = q.shape
    rows = batch * heads * -(-seqlen // 128) * 128
    grads = sum(x.numel() * x.element_size() for x in (q, k, v))
    return (grads + rows * headdim * 4 + 2 * rows * 4) / 2**20 + 1.0


def run_cell(dtype, headdim, causal, seqlen, args, reasons):
    batch, heads = max(1, TOKENS // seqlen), HIDDEN // headdim
    dv = args.headdim_v or headdim  # v's and out's head dim
    q, k, v = (torch.randn(batch, seqlen, heads, d, device="cuda", dtype=DTYPES[dtype]) for d in (headdim, headdim, dv))
    flops = 2 * batch * heads * seqlen**2 * (headdim + dv) / (2 if causal else 1)
    if args.backward or args.train:  # each library's own backward of its own forward; dq compared
        flops *= 2.5 if args.backward else 3.5
        for x in (q, k, v):
            x.requires_grad_()
        dout = torch.randn(batch, seqlen, heads, dv, device="cuda", dtype=DTYPES[dtype])
    calls, outs = {}, {}
    for name, (fn, context) in BACKENDS.items():
        try:
            with context(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # SDPA explains at length why it cannot run
                if args.backward:
                    out = fn(q, k, v, causal)
                    call = (lambda out=out: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)[0])
                elif args.train:  # a training step's attention: forward, then backward
                    call = (lambda fn=fn: torch.autograd.grad(fn(q, k, v, causal), (q, k, v), dout)[0])
                else:
                    call = (lambda fn=fn: fn(q, k, v, causal))
                outs[name] = call()
            calls[name] = (call, context)
        except RuntimeError as e:  # flash3's NotImplementedError and missing library too
            reasons.add(f"{name}: {str(e).splitlines()[0]}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        timed = median_ms(calls, args.warmup, args.iters)
    ms = {name: timed.get(name) for name in BACKENDS}
    memory = {}
    if args.backward:
        memory = {name: peak_mib(*calls[name]) if name in calls else None for name in ("flash3", "cuDNN")}
        memory["bound"] = backward_bound_mib(q, k, v)
    ref = outs.get("cuDNN")
    diff = {name: (outs[name] - ref).abs().max().item() if name in outs and ref is not None else None
            for name in ("flash3", "FA2")}
    suspect = False
    if diff["flash3"] is not None:
        atol = DIFF_ULPS * torch.finfo(q.dtype).eps * ref.abs().max().item()
        suspect = not diff["flash3"] <= 2 * (diff["FA2"] or 0.0) + atol  # NaN is suspect too
    over = memory.get("flash3") is not None and memory["flash3"] > memory["bound"]
    return {
        "dtype": dtype, "headdim": headdim, "headdim_v": dv, "causal": causal, "batch": batch, "seqlen": seqlen,
        "heads": heads,
        "ms_median": ms,
        "tflops": {name: flops / (t * 1e-3) / 1e12 if t else None for name, t in ms.items()},
        "max_abs_diff_vs_cudnn": diff,
        "suspect": suspect,
        **({"peak_mib": memory, "over_memory_bound": over} if memory else {}),
    }


def ratio(a, b):
    return a / b if a and b else None


def table(records):
    """Rows of strings under HEADER, shared by the console and Markdown outputs."""
    fmt = lambda x, spec: "n/a" if x is None else format(x, spec)  # noqa: E731
    rows = []
    for r in records:
        t, d = r["tflops"], r["max_abs_diff_vs_cudnn"]
        dims = str(r["headdim"]) + (f"/{r['headdim_v']}" if r.get("headdim_v", r["headdim"]) != r["headdim"] else "")
        rows.append([r["dtype"], dims, "yes" if r["causal"] else "no", str(r["seqlen"]),
                     fmt(t["flash3"], ".0f"), fmt(t["cuDNN"], ".0f"), fmt(t["FA2"], ".0f"),
                     fmt(ratio(t["flash3"], t["cuDNN"]), ".2f"), fmt(ratio(t["flash3"], t["FA2"]), ".2f"),
                     fmt(d["flash3"], ".2g") + (" !" if r["suspect"] else ""), fmt(d["FA2"], ".2g")])
        if "peak_mib" in r:
            m = r["peak_mib"]
            rows[-1] += [fmt(m["flash3"], ".0f") + (" !" if r["over_memory_bound"] else ""),
                         fmt(m["cuDNN"], ".0f"), fmt(m["bound"], ".0f")]
    return rows


def summary(records, from_seqlen=2048):
    """flash3/cuDNN over the cells where both ran: the geometric mean of all of them, and
    the lowest cell from `from_seqlen` on (issue 22's bars), as one line."""
    ratios = [(ratio(r["tflops"]["flash3"], r["tflops"]["cuDNN"]), r) for r in records]
    ratios = [(x, r) for x, r in ratios if x is not None]
    if not ratios:
        return "flash3/cuDNN: no cell where both ran"
    geomean = math.exp(statistics.fmean(math.log(x) for x, _ in ratios))
    line = f"flash3/cuDNN: geometric mean {geomean:.3f} over {len(ratios)} cells"
    later = [(x, r) for x, r in ratios if r["seqlen"] >= from_seqlen]
    if later:
        x, r = min(later, key=lambda item: item[0])
        line += (f"; lowest from seqlen {from_seqlen}: {x:.2f} ({r['dtype']} d{r['headdim']} "
                 f"{'causal' if r['causal'] else 'non-causal'} {r['seqlen']})")
    return line


def header(backward):
    return HEADER + (HEADER_MEMORY if backward else [])


def print_row(cells):
    print(" ".join(c.rjust(8) for c in cells), flush=True)


def write_markdown(path, meta, records):
    columns = header(meta["direction"] == "backward")
    lines = [f"# flash3 {meta['direction']} vs PyTorch SDPA (TFLOP/s), {meta['device']}, {meta['date']}", "",
             f"`{meta['command']}`; torch {meta['torch']}, CUDA {meta['cuda']}, cuDNN {meta['cudnn']}, "
             f"flash3 {meta['flash3']}, commit {meta['commit']}. diff: max |out - cuDNN's out|.", "",
             "| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(row) + " |" for row in table(records)]
    lines += ["", meta["summary"]]
    Path(path).write_text("\n".join(lines) + "\n")


def write_plot(path, meta, records):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    headdims, causals, dtypes, seqlens = (sorted({r[key] for r in records})
                                          for key in ("headdim", "causal", "dtype", "seqlen"))
    fig, axes = plt.subplots(len(headdims), len(causals), figsize=(5 * len(causals), 3.5 * len(headdims)),
                             squeeze=False)
    for (i, headdim), (j, causal) in itertools.product(enumerate(headdims), enumerate(causals)):
        ax = axes[i][j]
        for dtype in dtypes:
            cell = [r for r in records if (r["headdim"], r["causal"], r["dtype"]) == (headdim, causal, dtype)]
            for name in BACKENDS:
                label = name if len(dtypes) == 1 else f"{name} {dtype}"
                ax.plot([r["seqlen"] for r in cell], [r["tflops"][name] or float("nan") for r in cell],
                        marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(seqlens, [f"{s // 1024}k" if s % 1024 == 0 else str(s) for s in seqlens])
        ax.set_title(f"headdim {headdim}, {'causal' if causal else 'non-causal'}")
        ax.set_xlabel("seqlen")
        ax.set_ylabel("TFLOP/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.suptitle(f"Attention {meta['direction']}, {meta['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def int_list(text):
    return None if text == "all" else [int(x) for x in text.split(",")]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", choices=[*DTYPES, "all"], default="all")
    parser.add_argument("--headdim", type=int_list, default="all", help="comma-separated list or 'all'")
    parser.add_argument("--causal", choices=["0", "1", "all"], default="all")
    parser.add_argument("--seqlen", type=int_list, default="all", help="comma-separated list or 'all'")
    parser.add_argument("--quick", action="store_true", help="a fast look: --dtype bf16 --seqlen 1024,8192")
    parser.add_argument("--backward", action="store_true",
                        help="time the backward (FLOPs 2.5x the forward's; dq compared with cuDNN's)")
    parser.add_argument("--train", action="store_true",
                        help="time forward + backward together (FLOPs 3.5x the forward's; dq compared)")
    parser.add_argument("--headdim-v", type=int, default=None,
                        help="v's and out's head dim (default: the head dim; 128 with --headdim 192 is DeepSeek's)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--json", help="write the records and metadata here")
    parser.add_argument("--markdown", help="write the table here")
    parser.add_argument("--plot", help="write TFLOP/s against seqlen here (PNG)")
    parser.add_argument("--commit", help="recorded in the metadata")
    args = parser.parse_args()
    if args.backward and args.train:
        parser.error("--backward and --train are exclusive")
    if args.quick:
        args.dtype, args.seqlen = "bf16", [1024, 8192]
    if not torch.cuda.is_available():
        print("compare.py: no CUDA device", file=sys.stderr)
        return 3

    try:
        flash3_version = flash3.__version__
    except flash3.LibraryNotFoundError:
        flash3_version = None
    meta = {
        "tool": "bench/compare.py", "command": " ".join(sys.argv),
        "device": torch.cuda.get_device_name(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": args.commit, "flash3": flash3_version, "torch": torch.__version__,
        "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
        "warmup": args.warmup, "iters": args.iters,
        "direction": "backward" if args.backward else "forward+backward" if args.train else "forward",
    }
    print(f"{meta['device']}, torch {meta['torch']}, cuDNN {meta['cudnn']}, flash3 {flash3_version}: "
          f"{meta['direction']} TFLOP/s, median of {args.iters} calls after {args.warmup} warm-up")
    print_row(header(args.backward))
    records, reasons = [], set()
    for dtype in DTYPES if args.dtype == "all" else [args.dtype]:
        for headdim in args.headdim or [64, 128, 256]:
            for causal in [False, True] if args.causal == "all" else [args.causal == "1"]:
                for seqlen in args.seqlen or SEQLENS:
                    records.append(run_cell(dtype, headdim, causal, seqlen, args, reasons))
                    print_row(table(records[-1:])[0])
    for reason in sorted(reasons):
        print(f"n/a: {reason}")
    meta["summary"] = summary(records)
    print(meta["summary"])

    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "records": records}, indent=1) + "\n")
    if args.markdown:
        write_markdown(args.markdown, meta, records)
    if args.plot:
        write_plot(args.plot, meta, records)
    return 1 if any(r["suspect"] or r.get("over_memory_bound") for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
