"""Evaluating every writer at cross-device scale against a training round: LEAF's FEMNIST size (3,400 writers of the
shipped cross-device configs), LeafCNN, 10 writers a round (cross_device.py's workload, its files).

Per method: the median seconds of --rounds training rounds, then the evaluation of every writer's model on its test
split three ways, interleaved over --repeats passes in one process: `before` (4,096 rows a forward pass in NCHW
layout, every personalized writer's whole model run on its rows: the engine before evaluation at scale), `previous`
(512 rows a pass, weights made channels-last with `.contiguous`, which leaves a one-channel first convolution NCHW,
writers sharing a body run it once: the engine before eval_rows.py) and `now` (the CPU's rows fitted to the network,
256 for LeafCNN: `fedlight.plugin.eval_rows`; every convolution channels-last: `fedlight.plugin.channels_last`;
writers whose personal part lies in the head share their cluster's body: `fedlight.plugin.shared_body`). Each row
gives the best seconds and their ratio to a training round; the per-writer accuracies of the three ways are compared
(the last column counts writers whose accuracy differs: float rounding can move a near-tie's argmax).

    python benchmarks/evaluation_scale.py --root DIR [--methods fedavg fedper] [--rounds 3] [--repeats 2]

DIR holds LEAF-format FEMNIST files (cross_device.py --root writes them when DIR is empty).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cross_device import algorithm_class, shipped_algorithm_args, shipped_data_args  # noqa: E402


def federation(method: str, root: Path, per_round: int):
    """The shipped cross-device setting of `method` at 3,400 writers, without evaluation during training."""
    from fedlight import Federation, FederationConfig
    from fedlight.datamodules import FEMNISTFederated
    from fedlight.models import Classifier, LeafCNN

    data = FEMNISTFederated(**{**shipped_data_args(), "root": str(root)})
    torch.manual_seed(0)
    model = Classifier(LeafCNN(num_classes=62), lr=0.1)
    config = FederationConfig(
        rounds=1000, clients_per_round=per_round, batch_size=20, accelerator="cpu", eval_every=1000
    )
    return Federation(data, model, algorithm_class(method)(**shipped_algorithm_args(method)), config, seed=0)


@contextlib.contextmanager
def contiguous_channels_last(module: torch.nn.Module):
    """The previous engine's layout: each 4-D weight `.contiguous(memory_format=channels_last)`, which returns a
    (32, 1, 5, 5) weight as it is, so the first convolution's outputs stay NCHW."""
    swapped = [(p, p.data) for p in module.parameters() if p.dim() == 4]
    for parameter, own in swapped:
        parameter.data = own.contiguous(memory_format=torch.channels_last)
    try:
        yield
    finally:
        for parameter, own in swapped:
            parameter.data = own


WAYS = {  # way: (rows a pass, the layout's context, whether writers that share a body run it once)
    "before": (4096, lambda module: contextlib.nullcontext(), False),
    "previous": (512, contiguous_channels_last, True),
    "now": (None, None, True),
}


def evaluate(fed, way: str) -> tuple[float, np.ndarray]:
    """(seconds, each writer's test accuracy) of evaluating every writer `way`."""
    from fedlight.plugin.aggregation import ClientModels
    from fedlight.plugin.shared_body import SharedBodyModels

    import fedlight.plugin.model_view as model_view

    rows, layout, shared_bodies = WAYS[way]
    models, groups = fed.algorithm.evaluation_models()
    if not shared_bodies and isinstance(models, SharedBodyModels):
        models = ClientModels(models.model_of, len(models))
    view = fed.server.model
    saved = view._eval_batch_size, model_view.channels_last_on_cpu
    view._eval_batch_size = rows or view._eval_batch_size
    model_view.channels_last_on_cpu = layout or model_view.channels_last_on_cpu
    try:
        began = time.perf_counter()
        _, values = fed.evaluator.evaluate((models, groups), "test")
        seconds = time.perf_counter() - began
    finally:
        view._eval_batch_size, model_view.channels_last_on_cpu = saved
    return seconds, values["acc"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--methods", nargs="+", default=["fedavg", "fedper"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per_round", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    ways = list(WAYS)
    print(
        "| method | s/round | "
        + " | ".join(f"eval {w} s (x round)" for w in ways)
        + " | writers whose accuracy moved |"
    )
    print("|---|---|" + "---|" * (len(ways) + 1))
    for method in args.methods:
        fed = federation(method, args.root, args.per_round)
        rounds = []
        for number in range(1, args.rounds + 1):
            began = time.perf_counter()
            fed.run_round(number)
            rounds.append(time.perf_counter() - began)
        round_s = statistics.median(rounds[1:] or rounds)
        seconds: dict[str, list[float]] = {w: [] for w in ways}
        accuracies = {}
        for _ in range(args.repeats):
            for way in ways:
                s, accuracies[way] = evaluate(fed, way)
                seconds[way].append(s)
        changed = sum(int((~np.isclose(accuracies[w], accuracies["before"], equal_nan=True)).sum()) for w in ways[1:])
        cells = " | ".join(f"{min(seconds[w]):.1f} ({min(seconds[w]) / round_s:.1f}x)" for w in ways)
        print(f"| {method} | {round_s:.2f} | {cells} | {changed} |", flush=True)


if __name__ == "__main__":
    main()
