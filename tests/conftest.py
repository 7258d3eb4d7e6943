"""Shared test set-up: W&B offline with its folders in a temporary directory, one torch thread, and the fixtures
every test folder uses. Fixtures only: what tests import (small federations, crashed and resumed runs, data files)
is in the `helpers` package (tests/helpers/, importable through pytest's `pythonpath`)."""

import os
import tempfile

_wandb_home = tempfile.mkdtemp(prefix="fedlight-wandb-")
# One torch thread per test process: the test workers (pytest-xdist) are runs side by side, and a federation left to
# choose takes every usable core (fedlight.engine.threads), so two workers on 2 cores each ran 2 threads and every
# test took 2.7x its time alone. Tests of the default choice remove it (monkeypatch.delenv).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
for _var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
    os.environ.setdefault(_var, _wandb_home)

import pytest  # noqa: E402

import fedlight  # noqa: E402,F401  (first: it sets OpenMP's wait policy before torch loads, see fedlight/__init__)
import torch  # noqa: E402

torch.set_num_threads(1)  # for tests that use torch without a federation, whatever OMP_NUM_THREADS says


@pytest.fixture(autouse=True)
def own_trainer_memory(tmp_path_factory):
    """Every test starts with an empty memory of trainer choices (`fedlight.training.probe.recall`), so a test
    that probes measures, whatever ran before it (processes it starts inherit the variable)."""
    before = os.environ.get("FEDLIGHT_CACHE_DIR")
    os.environ["FEDLIGHT_CACHE_DIR"] = str(tmp_path_factory.mktemp("fedlight-cache"))
    yield
    if before is None:
        os.environ.pop("FEDLIGHT_CACHE_DIR")
    else:
        os.environ["FEDLIGHT_CACHE_DIR"] = before


@pytest.fixture
def tiny_run_args(tmp_path):
    """CLI arguments of a 3-round digits run writing into tmp_path, W&B off. The group size is fixed (the 6
    clients train vectorized together): with `vectorize: -1` each run would time the two trainers and could pick
    either, and two separate runs are compared number for number."""
    return [
        "fit",
        "--data",
        "fedlight.datamodules.DigitsFederated",
        "--data.num_clients",
        "6",
        "--model",
        "fedlight.models.Classifier",
        "--model.network",
        "fedlight.models.SmallCNN",
        "--model.network.init_args.width",
        "8",
        "--model.lr",
        "0.1",
        "--federation.rounds",
        "3",
        "--federation.batch_size",
        "32",
        "--federation.accelerator",
        "cpu",
        "--federation.vectorize",
        "6",
        "--logger.wandb",
        "false",
        "--output_dir",
        str(tmp_path),
    ]
