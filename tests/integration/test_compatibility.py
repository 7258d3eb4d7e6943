"""The compatibility table (`fedlight.run.compatibility`): made by running every algorithm with each extension,
shipped in docs/compatibility.md and printed by `fedlight list --compatibility` from the shipped rows. The shipped
table covers every registered algorithm and has no cell that fails other than by a one-line refusal; every row made
again here equals the shipped one; a DP cell that runs releases models carrying noise of the stated scale."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedlight.run import compatibility
from fedlight.run.compatibility_table import COLUMNS, ROWS, SETTING

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_table_covers_every_algorithm_and_column_and_nothing_fails():
    assert sorted(ROWS) == sorted(compatibility.algorithms()) == sorted(SETTING)
    assert set(SETTING.values()) <= set(compatibility.SETTINGS)
    assert COLUMNS == compatibility.COLUMNS
    for name, cells in ROWS.items():
        assert list(cells) == list(COLUMNS), name
        for column, (status, note) in cells.items():
            assert status in ("runs", "refused"), (name, column, note)
            assert note and "\n" not in note


def test_the_docs_page_is_the_shipped_table():
    page = (ROOT / "docs" / "compatibility.md").read_text()
    rows = {name: {column: compatibility.Cell(*cell) for column, cell in cells.items()} for name, cells in ROWS.items()}
    assert compatibility.markdown(rows) in page


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ROWS))
def test_every_row_made_again_from_the_code_is_the_shipped_one(name):
    """Every cell run again for two rounds: the same outcome, and a refusal the same one line (FedRC refused by
    privacy for its label counts, SR-FCA by FedBuff for its one-shot round, Local by privacy and the robust rule
    after round 1, ...)."""
    rows, settings = compatibility.table([name])
    assert {column: (c.status, c.note) for column, c in rows[name].items()} == ROWS[name]
    assert settings[name] == SETTING[name]  # the kind tests and benchmarks read instead of lists of names


def test_a_dp_cell_that_runs_releases_models_noised_at_the_stated_scale(monkeypatch):
    """FedAvg's one private round of m clients, clip C, noise z: the released model minus the same round's without
    noise is the noise over m, N(0, (z C / m)^2) in every entry."""
    from fedlight.aggregators.privacy import PrivacyMechanism
    from fedlight.algorithms.fedavg import FedAvg

    settings = compatibility.extension_settings("privacy")
    noisy = compatibility.tiny_federation(FedAvg(), "digits", settings)
    noisy.run_round(1)
    monkeypatch.setattr(
        PrivacyMechanism,
        "noise",
        lambda self, call, cluster, dim, device: torch.zeros(dim, dtype=torch.float64, device=device),
    )
    clean = compatibility.tiny_federation(FedAvg(), "digits", settings)
    clean.run_round(1)
    z, clip, m = 1.0, 1.0, compatibility.CLIENTS
    scaled = ((noisy.algorithm.models - clean.algorithm.models) * m / (z * clip)).double().flatten()
    assert len(scaled) > 1000
    assert abs(float(scaled.mean())) < 0.1 and 0.9 < float(scaled.std()) < 1.1


def test_the_command_line_prints_the_shipped_table_without_running_anything():
    code = (
        "import sys; from fedlight.run.cli import main; code = main(['list', '--compatibility']); "
        "print('ran' if 'fedlight.engine.federation' in sys.modules else 'ran nothing'); sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "ran nothing"
    srfca = lines.index("srfca")
    assert lines[srfca + 2].split()[:2] == ["FedBuff", "refused"] and "one-shot round" in lines[srfca + 2]
    stocfl = lines.index("stocfl")
    assert lines[stocfl + 2].split()[:2] == ["FedBuff", "runs"] and "global_copy re-based" in lines[stocfl + 2]
