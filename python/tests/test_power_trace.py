"""bench/power_trace.py's summary of nvidia-smi samples (CPU only: no GPU, no nvidia-smi)."""
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "power_trace.py"


def load():
    spec = importlib.util.spec_from_file_location("power_trace", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_medians_leave_out_the_start_and_count_the_power_cap():
    start = ["345, 80.5, 0x0000000000000001"] * 3  # idle before the command's first call
    run = ["1695, 705.0, 0x0000000000000004", "1680, 712.3, 0x0000000000000004",
           "1980, 640.0, 0x0000000000000000", "[N/A], 700.0, 0x0", "garbage"]
    line = load().summarize(start + run)
    assert line == ("power trace: 3 samples, SM clock median 1695 MHz (lowest 1680), "
                    "power median 705 W, power-capped 2/3")


def test_no_samples():
    assert load().summarize([]) == "power trace: no samples"


def test_usage_without_a_command():
    assert load().main(["--ms", "20"]) == 2
