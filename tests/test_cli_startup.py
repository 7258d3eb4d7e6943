"""The command line answers `list`, `--help` and one-line config errors without loading torch, Lightning or
scikit-learn (seconds of imports that none of these answers needs); each case runs in a fresh interpreter, which
reports the heavy modules loaded by the time it answered."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

HEAVY = ("torch", "lightning", "sklearn", "scipy", "wandb", "optuna")


def loaded_after(code: str) -> list[str]:
    """The heavy modules a fresh interpreter holds after running `code`."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_importing_the_command_line_loads_nothing_heavy():
    assert loaded_after("import fedlight.run.cli") == []


@pytest.mark.parametrize("argv", [["list"], ["fit", "--help"], ["fit", "--federation.roundz", "3"],
                                  ["fit", "--algorithm", "fedprxo"], ["tune", "--help"], ["sweep", "--help"]],
                         ids=lambda argv: " ".join(argv))
def test_an_answer_that_runs_nothing_loads_nothing_heavy(argv):
    code = ("import contextlib, io\nfrom fedlight.run.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            f"    try:\n        main({argv!r})\n    except SystemExit:\n        pass")
    assert loaded_after(code) == []


def test_a_run_that_names_no_algorithm_is_fedavg(tmp_path, tiny_run_args):
    from fedlight.run.cli import main

    assert main(tiny_run_args + ["--federation.rounds", "1", "--run_name", "plain"]) == 0
    saved = yaml.safe_load((tmp_path / "plain" / "config.yaml").read_text())
    assert saved["algorithm"]["class_path"] in ("fedlight.Algorithm", "fedlight.plugin.algorithm.Algorithm")
