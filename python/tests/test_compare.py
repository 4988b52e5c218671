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
