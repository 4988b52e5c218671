#!/usr/bin/env python3
"""Runs a command while nvidia-smi samples the GPU, then says what clock and power it ran at.

At long sequences the H200 sits at its 700 W software power cap and the SM clock falls
from 1980 MHz to ~1700 (docs/performance.md): a change that costs energy per FLOP shows
as a lower clock, and a 20-call benchmark cell reads partly before and partly under the
cap. Time long runs (300+ calls) with this beside them:

    python3 bench/power_trace.py -- build/bench/flash3_bench --dtype bf16 --headdim 128 \\
        --causal 0 --seqlen 16384 --warmup 3 --iters 300

The command's own output passes through; then one line: samples, median and lowest SM
clock, median power, and the share of samples under the software power cap (reason bit
0x4). Exit code: the command's; 2 on bad usage, 3 if nvidia-smi is missing.
"""
import shutil
import statistics
import subprocess
import sys
import tempfile

QUERY = "clocks.sm,power.draw.instant,clocks_event_reasons.active"
SW_POWER_CAP = 0x4


def summarize(lines, skip=3):
    """One line from nvidia-smi's `--format=csv,noheader,nounits` samples of QUERY.

    The first `skip` samples (the command starting) are left out of the medians.
    """
    samples = []
    for line in lines:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3:
            continue
        try:
            samples.append((float(fields[0]), float(fields[1]), int(fields[2], 16)))
        except ValueError:
            continue  # "[N/A]" and the like
    body = samples[skip:] or samples
    if not body:
        return "power trace: no samples"
    clocks = [s[0] for s in body]
    capped = sum(1 for s in body if s[2] & SW_POWER_CAP)
    return (f"power trace: {len(body)} samples, SM clock median {statistics.median(clocks):.0f} "
            f"MHz (lowest {min(clocks):.0f}), power median "
            f"{statistics.median(s[1] for s in body):.0f} W, power-capped {capped}/{len(body)}")


def main(argv):
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        print(__doc__.strip().splitlines()[0], "\nusage: power_trace.py [--ms N] -- COMMAND...",
              file=sys.stderr)
        return 2
    split = argv.index("--")
    ms = int(argv[argv.index("--ms") + 1]) if "--ms" in argv[:split] else 20
    if shutil.which("nvidia-smi") is None:
        print("power_trace.py: no nvidia-smi here", file=sys.stderr)
        return 3
    with tempfile.TemporaryFile(mode="w+") as trace:
        smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}",
                                "--format=csv,noheader,nounits", f"--loop-ms={ms}"], stdout=trace)
        try:
            rc = subprocess.call(argv[split + 1:])
        finally:
            smi.terminate()
            smi.wait()
        trace.seek(0)
        print(summarize(trace.readlines()))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
