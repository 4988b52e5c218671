"""bench/compare.py's timing loop on a stand-in for torch: no PyTorch or GPU needed.

The backends must take turns (the first one rotating from round to round), so that a
change of clock during a cell falls on all of them alike, and each must be timed --iters
times after --warmup calls.
"""
import contextlib
import importlib.util
import sys
import types
from pathlib import Path

import pytest

COMPARE = Path(__file__).resolve().parents[2] / "bench" / "compare.py"


class FakeClock:
    """The stream's time: each backend's call advances it by that backend's duration."""

    now = 0.0


class FakeEvent:
    def __init__(self, enable_timing=False):
        self.time = None

    def record(self):
        self.time = FakeClock.now

    def elapsed_time(self, other):
        return other.time - self.time


@pytest.fixture
def compare(monkeypatch):
    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(Event=FakeEvent, synchronize=lambda: None)
    torch.bfloat16 = torch.float16 = object()
    nn = types.ModuleType("torch.nn")
    functional = types.ModuleType("torch.nn.functional")
    attention = types.ModuleType("torch.nn.attention")
    attention.SDPBackend = types.SimpleNamespace(CUDNN_ATTENTION=1, FLASH_ATTENTION=2)
    attention.sdpa_kernel = lambda backend: contextlib.nullcontext()
    for name, module in (("torch", torch), ("torch.nn", nn), ("torch.nn.functional", functional),
                         ("torch.nn.attention", attention)):
        monkeypatch.setitem(sys.modules, name, module)
    spec = importlib.util.spec_from_file_location("compare_under_test", COMPARE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def backends(calls, durations):
    def make(name):
        def call():
            calls.append(name)
            FakeClock.now += durations[name]
        return call
    return {name: (make(name), contextlib.nullcontext) for name in durations}


def test_backends_take_turns_and_each_is_timed_iters_times(compare):
    calls = []
    durations = {"flash3": 1.0, "cuDNN": 2.0, "FA2": 3.0}
    warmup, iters = 5, 22
    medians = compare.median_ms(backends(calls, durations), warmup, iters)

    assert medians == durations
    timed = calls[warmup * len(durations):]
    assert calls[:warmup * len(durations)] == [n for n in durations for _ in range(warmup)]
    assert all(timed.count(name) == iters for name in durations)
    # One run of calls per backend and round; the first backend rotates.
    runs = [name for i, name in enumerate(timed) if i == 0 or timed[i - 1] != name]
    names = list(durations)
    expected = [names[(r + i) % len(names)] for r in range(compare.TIMING_ROUNDS)
                for i in range(len(names))]
    assert runs == expected


def test_a_clock_change_falls_on_every_backend(compare):
    """The clock drops to a third halfway through the timed calls (as after a long cell
    under the power cap): every backend is timed at both speeds."""
    warmup, iters = 2, 20
    names = ("flash3", "cuDNN")
    calls, seen = [], {name: set() for name in names}

    def make(name):
        def call():
            calls.append(name)
            slow = len(calls) > len(names) * (warmup + iters // 2)
            FakeClock.now += 3.0 if slow else 1.0
            seen[name].add(slow)
        return call

    compare.median_ms({name: (make(name), contextlib.nullcontext) for name in names}, warmup, iters)
    assert all(seen[name] == {False, True} for name in names)


class FakeTensor:
    def __init__(self, shape, element_size):
        self.shape, self._element_size = shape, element_size

    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def element_size(self):
        return self._element_size


def test_backward_memory_bound_counts_gradients_and_the_fp32_dq_sums(compare):
    # batch 2, seqlen 100 (rows padded to 128), 4 heads, head dim 64, 16-bit.
    q = k = v = FakeTensor((2, 100, 4, 64), 2)
    grads = 3 * 2 * 100 * 4 * 64 * 2
    rows = 2 * 4 * 128
    expected = (grads + rows * 64 * 4 + 2 * rows * 4) / 2**20 + 1.0
    assert compare.backward_bound_mib(q, k, v) == pytest.approx(expected)


def test_backward_over_its_memory_bound_is_marked(compare):
    record = {"dtype": "bf16", "headdim": 128, "headdim_v": 128, "causal": False, "seqlen": 1024,
              "tflops": {"flash3": 500.0, "cuDNN": 450.0, "FA2": 300.0},
              "max_abs_diff_vs_cudnn": {"flash3": 0.001, "FA2": 0.001}, "suspect": False,
              "peak_mib": {"flash3": 300.0, "cuDNN": 280.0, "bound": 257.0}, "over_memory_bound": True}
    row = compare.table([record])[0]
    assert len(row) == len(compare.header(True))
    assert row[-3] == "300 !" and row[-2] == "280" and row[-1] == "257"
    assert not row[9].endswith("!")  # the outputs agree: only the memory is marked
    within = dict(record, over_memory_bound=False,
                  peak_mib={"flash3": 200.0, "cuDNN": 280.0, "bound": 257.0})
    assert compare.table([within])[0][-3] == "200"


def cell(headdim, causal, seqlen, flash3, cudnn):
    return {"dtype": "bf16", "headdim": headdim, "causal": causal, "seqlen": seqlen,
            "tflops": {"flash3": flash3, "cuDNN": cudnn, "FA2": None}}


def test_summary_gives_the_geometric_mean_and_the_lowest_cell_from_2k(compare):
    records = [cell(64, False, 1024, 200.0, 250.0),   # 0.8: in the mean, not in the lowest
               cell(64, False, 2048, 300.0, 250.0),   # 1.2
               cell(128, True, 4096, 330.0, 300.0),   # 1.1
               cell(256, True, 8192, None, 300.0)]    # flash3 n/a: left out
    line = compare.summary(records)
    geomean = (0.8 * 1.2 * 1.1) ** (1 / 3)
    assert f"geometric mean {geomean:.3f} over 3 cells" in line
    assert "lowest from seqlen 2048: 1.10 (bf16 d128 causal 4096)" in line


def test_summary_without_a_common_cell(compare):
    assert compare.summary([cell(64, False, 1024, None, 250.0)]) == "flash3/cuDNN: no cell where both ran"
