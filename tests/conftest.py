"""Shared test set-up: W&B offline with its folders in a temporary directory, small federations."""
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

from fedlight.datamodules import DigitsFederated, Rotations  # noqa: E402
from fedlight import Federation, FederationConfig  # noqa: E402
from fedlight.models import Classifier, SmallCNN  # noqa: E402


def small_federation(algorithm=None, num_clients: int = 6, rounds: int = 2, seed: int = 0, partition=None,
                     lr: float = 0.1, momentum: float = 0.0, public_size: int = 0, privacy=None, system=None,
                     attack=None, server_optimizer=None, **config) -> Federation:
    """A fast federation on digits: a narrow SmallCNN, few clients, one local epoch; clients train one after
    another unless `vectorize` is given (tests of the sequential trainer compare exact values). `privacy`: a
    `PrivacyConfig` (the run's `privacy:` section); `system`: a `SystemConfig` (its `system:` section); `attack`: an
    `AttackConfig` (its `attack:` section)."""
    torch.manual_seed(seed)
    model = Classifier(SmallCNN(1, 10, 8, width=8), lr=lr, momentum=momentum)
    data = DigitsFederated(num_clients=num_clients, partition=partition or Rotations(2), public_size=public_size)
    aggregator = aggregator_section(config)
    settings = {"rounds": rounds, "local_epochs": 1, "batch_size": 32, "accelerator": "cpu", "vectorize": 0, **config}
    return Federation(data, model, algorithm, FederationConfig(**settings), seed=seed, privacy=privacy, system=system,
                      attack=attack, aggregator=aggregator, server_optimizer=server_optimizer)


def aggregator_section(config: dict):
    """The `aggregator:` section from a test's `aggregator="median", aggregator_f=2, ...` keywords, taken out of
    `config` (None when it gives none: the mean)."""
    from fedlight.aggregators.config import AggregatorConfig

    names = {"aggregator": "rule", "aggregator_f": "f", "aggregator_beta": "beta", "aggregator_clip": "clip",
             "aggregator_keep": "keep"}
    given = {field: config.pop(key) for key, field in names.items() if key in config}
    return AggregatorConfig(**given) if given else None


def every_row(value):
    """A client state (`fedlight.plugin.client_state.ClientState`) as one tensor of every client's row; any other
    value as it is: to compare an algorithm's attributes across runs."""
    from fedlight.plugin.client_state import ClientState

    return value.read(range(value.num_clients)) if isinstance(value, ClientState) else value


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
    return ["fit", "--data", "fedlight.datamodules.DigitsFederated", "--data.num_clients", "6",
            "--model", "fedlight.models.Classifier", "--model.network", "fedlight.models.SmallCNN",
            "--model.network.init_args.width", "8", "--model.lr", "0.1",
            "--federation.rounds", "3", "--federation.batch_size", "32", "--federation.accelerator", "cpu",
            "--federation.vectorize", "6", "--logger.wandb", "false", "--output_dir", str(tmp_path)]


def crash_and_resume(args: list[str], run_dir, monkeypatch, crash_round: int = 3, after_the_work: bool = False,
                     before_resuming=None) -> None:
    """Run `args` as run folder `run_dir` (its --output_dir) with a crash (Ctrl-C) in `crash_round`, then resume it
    to the end; the rounds before the crash must be saved. The crash comes as the round starts, or with
    `after_the_work` once the round's work is done (its client state written) but before anything records it;
    `before_resuming(run_dir)` may then change the folder (remove a checkpoint)."""
    from fedlight.engine.federation import Federation
    from fedlight.run.cli import main

    real_run_round = Federation.run_round

    def crash(self, round):
        if round == crash_round and not after_the_work:
            raise KeyboardInterrupt("killed")
        result = real_run_round(self, round)
        if round == crash_round:
            raise KeyboardInterrupt("killed")
        return result

    monkeypatch.setattr(Federation, "run_round", crash)
    assert main(args + ["--run_name", run_dir.name]) == 130
    monkeypatch.setattr(Federation, "run_round", real_run_round)
    assert (run_dir / "metrics.csv").read_text().count("\n") == crash_round  # the header and the saved rounds
    if before_resuming is not None:
        before_resuming(run_dir)
    assert main(args + ["--run_name", run_dir.name, "--resume", str(run_dir)]) == 0


def resumed_and_whole(args: list[str], run_root, monkeypatch, crash_round: int = 3) -> tuple[list, list]:
    """The metrics.csv rows of `args` run whole (run folder "whole") and crashed in `crash_round`, then resumed
    ("crashed"), both under `run_root` (the --output_dir in `args`): equal when resuming loses nothing."""
    from fedlight.run.cli import main
    from tests.test_resume import rows

    assert main(args + ["--run_name", "whole"]) == 0
    crash_and_resume(args, run_root / "crashed", monkeypatch, crash_round=crash_round)
    return rows(run_root / "crashed" / "metrics.csv"), rows(run_root / "whole" / "metrics.csv")


def hand_set_times(model, compute_s, transfer_s):
    """Give a system model's clients devices on which their nominal local work (all local steps, one model each
    way) takes `compute_s` and their transfers `transfer_s` seconds: the clock then charges exactly these times to a
    method whose clients run their local steps (`fedlight.system.work_cost`)."""
    import numpy as np

    from fedlight.system.clock import DeviceProfiles
    from fedlight.system.work_cost import WorkCost

    compute_s, transfer_s = np.asarray(compute_s, dtype=float), np.asarray(transfer_s, dtype=float)
    cost = model.cost
    speeds = model.steps * cost.batch_size / compute_s
    links = np.divide(2 * cost.model_bits / 1e6, transfer_s, out=np.full_like(transfer_s, np.inf), where=transfer_s > 0)
    model.devices = DeviceProfiles(speeds, links)
    model.compute_s, model.transfer_s = compute_s.copy(), transfer_s.copy()
    model.cost = WorkCost(model.devices, cost.batch_size, cost.model_bits, compute_s.copy())
