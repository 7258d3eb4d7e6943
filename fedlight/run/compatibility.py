"""The compatibility table: every algorithm of the registry against each round extension, found by running it.

Nothing in it is declared. Each cell is a two-round run of the algorithm, with its default settings, on a tiny
federation (20 clients of scikit-learn's digits in two rotations and a narrow CNN; for a method on LoRA adapters,
which refuses a network without them, the same digits and a tiny random ViT with adapters; for an algorithm that
refuses a classifier, 20 clients of points from Gaussians and a centroid model), with one extension configured:

- `privacy`: client-level DP (noise multiplier 1, clip 1);
- `FedBuff`: asynchronous rounds (3 arrivals an update, 8 clients in flight);
- `robust + attack`: the trimmed mean against 20 % sign-flipping clients;
- `deadline`: the system model's devices, a deadline at the 75th percentile of the clients' times, partial work;
- `newcomers`: 4 of the clients held out of training and evaluated as newcomers;
- `server optimizer`: FedAdam's server step (`server_optimizer.kind: adam`) on every model the method aggregates;
- `cohort`: 5 of the 20 clients a round (`federation.clients_per_round`), as cross-device runs sample them.

A cell "runs", with what the extension does to which entry of the client's message (`fedlight.plugin.message`), or
is "refused" with the one line the run stops with, at set-up or after round 1; a run that fails another way is a
bug, and the cell says "fails". `python -m fedlight.run.compatibility --write` makes `docs/compatibility.md` and
`fedlight/run/compatibility_table.py` (what `fedlight list --compatibility` prints without running anything);
`tests/integration/test_compatibility.py` checks that they are what the code does.

Not in the table: several processes (tests/integration/test_distributed.py runs methods of each kind over them;
FedBuff refuses them). The virtual clock runs with every algorithm and charges what its clients ran
(`fedlight.system.work_cost`).
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from fedlight.run.registry import ALGORITHMS

CLIENTS = 20
#: each column: the Federation keyword arguments of its extension, built when asked (the classes load torch)
COLUMNS = ("privacy", "FedBuff", "robust + attack", "deadline", "newcomers", "server optimizer", "cohort")
COHORT = 5  # the cohort column's clients a round, of CLIENTS


@dataclass(frozen=True)
class Cell:
    """One algorithm with one extension: "runs" (and what the extension does), "refused" or "fails" (and the line)."""

    status: str
    note: str


def extension_settings(column: str) -> dict[str, Any]:
    """The Federation keyword arguments (and the data module's, under "data", the FederationConfig's, under
    "config") of one column."""
    from fedlight.aggregators.attacks import AttackConfig
    from fedlight.aggregators.config import AggregatorConfig
    from fedlight.aggregators.privacy import PrivacyConfig
    from fedlight.aggregators.server_optimizer import ServerOptimizerConfig
    from fedlight.system.config import SystemConfig

    settings: dict[str, dict[str, Any]] = {
        "privacy": {"privacy": PrivacyConfig(noise_multiplier=1.0, clip=1.0)},
        "FedBuff": {"system": SystemConfig(buffer_size=3, concurrency=8)},
        "robust + attack": {
            "aggregator": AggregatorConfig(rule="trimmed_mean"),
            "attack": AttackConfig(kind="sign_flip", fraction=0.2),
        },
        "deadline": {"system": SystemConfig(deadline_percentile=75.0, partial_work=True)},
        "newcomers": {"data": {"holdout_clients": 4}},
        "server optimizer": {"server_optimizer": ServerOptimizerConfig(kind="adam")},
        "cohort": {"config": {"clients_per_round": COHORT}},
    }
    return settings[column]


#: the tiny federations, in the order a row's is found: the first its algorithm runs on with no extension
SETTINGS = ("digits", "adapters", "points")


@functools.cache
def tiny_vit_folder() -> str:
    """A tiny random ViT for 8 x 8 digits, saved once per process (the adapters' setting)."""
    folder = Path(tempfile.mkdtemp(prefix="fedlight-tiny-vit-")) / "vit"
    load("fedlight.models.tiny_pretrained.make_tiny")(
        "vit", folder, num_classes=10, image_size=8, channels=1, patch_size=2, hidden=16
    )
    return str(folder)


def tiny_federation(algorithm: Any, setting: str, settings: dict[str, Any]) -> Any:
    """A two-round federation of `algorithm` on digits with a CNN, on digits with a tiny ViT's LoRA adapters, or on
    Gaussian points (`setting`, one of `SETTINGS`) with `settings`."""
    import torch

    from fedlight.engine.config import FederationConfig
    from fedlight.engine.federation import Federation

    settings = dict(settings)
    data_options = settings.pop("data", {})
    config_options = settings.pop("config", {})
    torch.manual_seed(0)
    if setting == "points":  # the classes by path, as a run config names them: the core imports no data module or model
        data = load("fedlight.datamodules.SyntheticGaussians")(
            num_clients=CLIENTS, points_per_client=40, test_fraction=0.2, **data_options
        )
        model: Any = load("fedlight.models.CentroidModel")()
    else:
        rotations = load("fedlight.datamodules.Rotations")(2)
        data = load("fedlight.datamodules.DigitsFederated")(
            num_clients=CLIENTS, partition=rotations, public_size=60, **data_options
        )
        if setting == "adapters":
            model = load("fedlight.models.PretrainedClassifier")(tiny_vit_folder(), num_classes=10, lr=0.01)
        else:
            network = load("fedlight.models.SmallCNN")(1, 10, 8, width=8)
            model = load("fedlight.models.Classifier")(network, lr=0.1)
    rounds = 1 if getattr(algorithm, "one_shot", False) else 2
    federation_config = FederationConfig(
        rounds=rounds,
        local_epochs=1,
        batch_size=32,
        accelerator="cpu",
        vectorize=0,
        eval_every=rounds,
        **config_options,
    )
    return Federation(data, model, algorithm, federation_config, seed=0, **settings)


def run_cell(make: Callable[[], Any], setting: str, settings: dict[str, Any]) -> tuple[Any, Exception | None]:
    """(the federation, or None, and the exception that stopped it, or None) of a run of every round."""
    federation = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            federation = tiny_federation(make(), setting, settings)
            for round in range(1, federation.config.rounds + 1):
                federation.run_round(round)
    except Exception as error:  # the cell records what stopped it
        return federation, error
    return federation, None


def what_it_does(column: str, federation: Any) -> str:
    """What the extension of `column` does to the entries of the algorithm's message, from the run itself."""
    schema = federation.server.message
    models = schema.of_kind("model")
    also = f" and {', '.join(models)}" if models else ""
    if column == "privacy":
        return f"clips and noises the model{also} ({federation.extensions.summary()['privacy']['accounting']})"
    if column == "FedBuff":
        sums = schema.of_kind("summed")
        sent = f"; {', '.join(sums)} as sent" if sums else ""
        return f"the model{also} re-based where it moved since the client was sent out, as trained where not{sent}"
    if column == "robust + attack":
        unattacked = [name for name in models if name not in schema.trained_from]
        honest = f"; attackers leave {', '.join(unattacked)} as trained" if unattacked else ""
        return f"attacks and trims the model{also} within each cluster{honest}"
    if column == "deadline":
        from fedlight.system.system_model import SystemModel

        charges = federation.extension(SystemModel).charges
        work = f"{charges['work_x_local_steps']:.2g}x its local steps' time" if charges else "its local steps"
        extra = charges.get("bytes_sent_beside_model", 0.0)
        sent = f", the model and {extra / 1e3:.3g} kB up" if extra else ", the model up"
        down = charges.get("models_received", 1)
        return f"drops or cuts short late clients; charges a client {work}, {down} model{'s' * (down > 1)} down{sent}"
    if column == "server optimizer":
        from fedlight.aggregators.server_optimizer import ServerOptimizer

        optimizer = federation.extension(ServerOptimizer)
        count = len(optimizer.states)
        part = "; the shared part only" if optimizer.shared_part_only else ""
        return f"steps each aggregated model with its own Adam state ({count} kept{part})"
    if column == "cohort":
        return f"trains a cohort of {COHORT} of the {CLIENTS} clients a round (federation.clients_per_round)"
    return "gives each newcomer a model (newcomer_models)"


def setting_of(make: Callable[[], Any]) -> str:
    """The tiny federation the algorithm `make` builds runs on: the first of `SETTINGS` whose plain run succeeds
    (points, the last, when none does)."""
    return next((s for s in SETTINGS[:-1] if run_cell(make, s, {})[1] is None), SETTINGS[-1])


def cell(make: Callable[[], Any], column: str, setting: str) -> Cell:
    """The cell of the algorithm `make` builds under `column`, on its tiny federation (`setting`)."""
    federation, error = run_cell(make, setting, extension_settings(column))
    if error is None:
        return Cell("runs", what_it_does(column, federation))
    line = str(error).splitlines()[0] if str(error) else type(error).__name__
    return Cell("refused" if isinstance(error, ValueError) else "fails", line)


def algorithms() -> dict[str, str]:
    """Short name -> class path of every registered algorithm."""
    return {ep.name: ep.value.replace(":", ".") for ep in entry_points(group=ALGORITHMS)}


def load(path: str) -> Any:
    """The class at the dotted `path` (imported by name, as a config's class_path is)."""
    import importlib

    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def table(
    names: list[str] | None = None, columns: tuple[str, ...] = COLUMNS
) -> tuple[dict[str, dict[str, Cell]], dict[str, str]]:
    """(name -> column -> cell, name -> the setting it runs on), for `names` (every registered algorithm when None).
    The settings are the registry's derived kinds: "adapters" for a method that refuses a network without LoRA
    adapters, "points" for one that refuses a classifier (a data-clustering method), "digits" for the rest; tests
    and benchmarks read them from the shipped table (`SETTING`) instead of keeping lists of names."""
    found = algorithms()
    rows, settings = {}, {}
    for name in sorted(found) if names is None else names:
        make = load(found[name])
        settings[name] = setting_of(make)
        rows[name] = {column: cell(make, column, settings[name]) for column in columns}
    return rows, settings


def markdown(rows: dict[str, dict[str, Cell]]) -> str:
    """The table as the docs page shows it."""
    head = "| algorithm | " + " | ".join(COLUMNS) + " |\n|---|" + "---|" * len(COLUMNS) + "\n"
    mark = {"runs": "runs", "refused": "**refused**", "fails": "**FAILS**"}
    body = "".join(
        f"| `{name}` | " + " | ".join(f"{mark[c.status]}: {c.note.replace('|', '/')}" for c in cells.values()) + " |\n"
        for name, cells in rows.items()
    )
    return head + body


def python_source(rows: dict[str, dict[str, Cell]], settings: dict[str, str]) -> str:
    """`compatibility_table.py`: the rows and each algorithm's setting as literals, for `fedlight list
    --compatibility` and for what reads an algorithm's kind."""
    literal = {name: {column: (c.status, c.note) for column, c in cells.items()} for name, cells in rows.items()}
    return (
        '"""The compatibility table as `python -m fedlight.run.compatibility --write` last made it (do not edit: '
        'tests/integration/test_compatibility.py checks it against the code)."""\n'
        f"COLUMNS = {COLUMNS!r}\nROWS = {literal!r}\nSETTING = {settings!r}\n"
    )


def main(argv: list[str] | None = None) -> None:
    """`python -m fedlight.run.compatibility`: print the table for `names` (every registered algorithm when none); with
    `--write`, also write docs/compatibility.md and compatibility_table.py."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write docs/compatibility.md and compatibility_table.py")
    parser.add_argument("names", nargs="*", help="algorithms (default: every registered one)")
    options = parser.parse_args(argv)
    rows, settings = table(options.names or None)
    page = markdown(rows)
    if options.write:
        root = Path(__file__).resolve().parents[2]
        intro = __doc__.split("\n\n")[1:3]
        (root / "docs" / "compatibility.md").write_text(
            "# Compatibility: algorithms x extensions\n\n" + "\n\n".join(intro) + "\n\n" + page
        )
        (Path(__file__).parent / "compatibility_table.py").write_text(python_source(rows, settings))
    print(page)


if __name__ == "__main__":
    main()
