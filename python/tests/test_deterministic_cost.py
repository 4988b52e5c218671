"""bench/deterministic_cost.py without a GPU: its arithmetic, and its runs of a stand-in
flash3_bench (a script that writes flash3_bench's JSON)."""
import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "deterministic_cost.py"


@pytest.fixture
def cost():
    spec = importlib.util.spec_from_file_location("deterministic_cost_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(headdim, causal, seqlen, ms, tflops=100.0):
    return {"dtype": "bf16", "headdim": headdim, "causal": causal, "seqlen": seqlen,
            "ms_median": ms, "tflops": tflops}


def test_cost_is_the_ratio_of_the_medians_over_the_runs(cost):
    runs = {"default": [[record(64, False, 8192, 1.0)], [record(64, False, 8192, 1.2)],
                        [record(64, False, 8192, 5.0)]],
            "deterministic": [[record(64, False, 8192, 1.1)], [record(64, False, 8192, 1.3)],
                              [record(64, False, 8192, 1.2)]]}
    (row,) = cost.costs(runs)
    assert row["default_ms"] == 1.2 and row["deterministic_ms"] == 1.2
    assert row["cost"] == pytest.approx(0.0)


def test_a_cell_that_failed_in_a_run_is_left_out(cost):
    runs = {"default": [[record(64, False, 8192, 1.0), record(128, True, 8192, 2.0)]],
            "deterministic": [[record(64, False, 8192, 1.1), record(128, True, 8192, None)]]}
    rows = cost.costs(runs)
    assert [(r["headdim"], r["causal"]) for r in rows] == [(64, False)]
    assert rows[0]["cost"] == pytest.approx(0.1)


def test_a_cell_over_the_bound_is_marked(cost):
    runs = {"default": [[record(64, False, 8192, 1.0), record(128, False, 8192, 1.0)]],
            "deterministic": [[record(64, False, 8192, 1.2), record(128, False, 8192, 1.05)]]}
    text = cost.lines(cost.costs(runs), 0.15)
    assert any("| 64 | no | 8192 |" in line and line.endswith("20.0% ! |") for line in text)
    assert any("| 128 | no | 8192 |" in line and line.endswith("5.0% |") for line in text)
    assert text[-1] == "largest cost 20.0% (d64 non-causal 8192), bound 15%"


FAKE_BENCH = """\
#!{python}
import json, sys
args = sys.argv[1:]
path = args[args.index("--json") + 1]
ms = {det_ms} if "--deterministic" in args else 1.0
with open(path, "w") as f:
    json.dump({{"records": [{{"dtype": "bf16", "headdim": 128, "causal": False, "seqlen": 8192,
                            "ms_median": ms, "tflops": 500.0 / ms}}]}}, f)
"""


@pytest.mark.parametrize("det_ms, expected", [(1.1, 0), (1.3, 1)])
def test_main_runs_both_modes_and_exits_1_over_the_bound(cost, tmp_path, capsys, det_ms, expected):
    bench = tmp_path / "flash3_bench"
    bench.write_text(FAKE_BENCH.format(python=sys.executable, det_ms=det_ms))
    bench.chmod(0o755)
    out = tmp_path / "cost.json"
    assert cost.main(["--bench", str(bench), "--rounds", "3", "--json", str(out)]) == expected
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 1 and rows[0]["cost"] == pytest.approx(det_ms - 1.0)
    assert "largest cost" in capsys.readouterr().out


def test_main_fails_when_the_bench_fails(cost, tmp_path):
    bench = tmp_path / "flash3_bench"
    bench.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import sys
        sys.exit(3)
        """))
    bench.chmod(0o755)
    assert cost.main(["--bench", str(bench), "--rounds", "1"]) == 1
