"""benchmarks/method_table.py: README's ranking with seed intervals, the paired marks and whether the best and the
median method separate, against values worked by hand."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

T_975_2 = 4.302653  # Student-t quantile 0.975 with 2 degrees of freedom


def write_runs(root: Path, selected: dict[str, list[float]]) -> None:
    """Run folders <name>-s<seed> whose summaries hold `selected` as the validation-selected mean accuracy."""
    for name, values in selected.items():
        for seed, value in enumerate(values):
            run = root / f"{name}-s{seed}"
            run.mkdir()
            (run / "metrics.csv").write_text(f"round,test/acc_mean\n1,{value}\n")
            summary = {
                "run": run.name,
                "seed": seed,
                "val_selected/test/acc_mean": value,
                "val_selected/test/acc_worst": value - 0.2,
                "test/acc_mean": value,
                "test/acc_resolution": 0.002,
            }
            (run / "summary.json").write_text(json.dumps(summary))
            (run / "config.yaml").write_text(f"seed: {seed}\nalgorithm: {name}\n")


def test_ranking_marks_and_separation_worked_by_hand(tmp_path, capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import method_table

    write_runs(
        tmp_path,
        {
            "fedavg": [0.79, 0.83, 0.80],  # best - fedavg: 0.01, -0.01, 0.01: mean 0.0033, not told apart
            "best": [0.80, 0.82, 0.81],
            "weak": [0.70, 0.71, 0.69],  # weak - fedavg: -0.09, -0.12, -0.11: mean -0.107, sd 0.0153
        },
    )
    assert method_table.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = {line.split(" | ")[1]: line for line in out.splitlines() if line.startswith("| ") and " | " in line}
    assert [line.split(" | ")[0] for line in (rows["best"], rows["fedavg"], rows["weak"])] == ["| 1", "| 2", "| 3"]
    assert "0.810 ± " in rows["best"] and "| best |" in rows["best"]
    assert "= best" in rows["fedavg"]
    half = T_975_2 * 0.015275 / math.sqrt(3)  # the paired differences' sample sd over the 3 seeds
    assert f"-0.107 ± {half:.3f} *" in rows["weak"]
    # weak against the best: 0.10, 0.11, 0.12 below it, sd 0.01: an interval of +-0.025 that excludes 0
    assert "= best" not in rows["weak"] and f"-0.110 ± {T_975_2 * 0.01 / math.sqrt(3):.3f}" in rows["weak"]
    # the median of 3 ranked methods is the second, fedavg, which the seeds do not tell apart from the best
    assert "Best (best) − median (fedavg): 0.003" in out and "NOT separated at 95 %" in out
    assert "by 0.0020" in out
