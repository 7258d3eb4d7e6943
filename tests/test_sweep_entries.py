"""A sweep entry's own overrides reach only that entry's runs (FedAvg-FT beside FedAvg in one sweep)."""
from __future__ import annotations

from pathlib import Path

import pytest

from fedlight.run.sweep import SweepConfig, SweepError, combinations, fit_args


def test_an_entrys_overrides_reach_only_its_own_runs(tmp_path):
    config = SweepConfig(base="base.yaml", seeds=[0, 1], output_dir=str(tmp_path), overrides={"federation.rounds": 3},
                         algorithms=["fedavg", {"class_path": "fedavg", "name": "fedavg-ft",
                                                "overrides": {"federation.finetune_epochs": 1}}])
    grid = combinations(config, Path("sweep.yaml"))
    assert [c.name for c in grid] == ["fedavg-s0", "fedavg-s1", "fedavg-ft-s0", "fedavg-ft-s1"]
    plain, tuned = (fit_args(grid[i], Path("base.yaml"), config) for i in (0, 2))
    assert "--federation.finetune_epochs" not in plain
    assert tuned[tuned.index("--federation.finetune_epochs") + 1] == "1"
    assert tuned[tuned.index("--federation.rounds") + 1] == "3"  # the sweep's own overrides still apply


def test_an_unknown_key_of_an_entry_is_named():
    config = SweepConfig(base="base.yaml", algorithms=[{"class_path": "fedavg", "override": {}}])
    with pytest.raises(SweepError, match="unknown key 'override'.*overrides"):
        combinations(config, Path("sweep.yaml"))
