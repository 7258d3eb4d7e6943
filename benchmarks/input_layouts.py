"""The vectorized trainer's two layouts of the image batches (`VectorizedTrainer.channels_last_inputs`), timed side by
side in one process: one round's local training of all clients in one group, the layouts taking turns (which goes
first alternates), medians of wall and CPU time. Auto's probe chooses between them; this shows what is at stake.

    python benchmarks/input_layouts.py --network lenet5 --batch_size 10 --pool 12000 --repeats 12

Data and networks as in vectorized.py (Dirichlet(0.5) over `--pool` random 1x28x28 images, 20 clients, one epoch).
"""

from __future__ import annotations

import argparse
import statistics
import time

from vectorized import NETWORKS, build


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--network", default="lenet5", choices=list(NETWORKS))
    parser.add_argument("--batch_size", type=int, default=10)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--pool", type=int, default=12_000)
    parser.add_argument("--repeats", type=int, default=12)
    args = parser.parse_args()
    args.accelerator, args.precision = "cpu", "32-true"
    fed = build(args, args.network, args.batch_size, args.clients)
    execution, clients = fed.execution, list(range(args.clients))
    trainer = execution.training.vectorized
    assert trainer is not None and trainer.layouts_differ, "the layouts differ only for a convolution on a CPU"
    wall: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    for channels_last in (True, False):  # warm-up: each layout's first-call costs
        trainer.channels_last_inputs = channels_last
        execution.train(1, clients)
    for repeat in range(args.repeats):
        for channels_last in (True, False) if repeat % 2 else (False, True):
            trainer.channels_last_inputs = channels_last
            began, began_cpu = time.perf_counter(), time.process_time()
            execution.train(1, clients)
            wall[channels_last].append(time.perf_counter() - began)
            cpu[channels_last].append(time.process_time() - began_cpu)
    median = statistics.median
    pairs = [a / b for a, b in zip(wall[False], wall[True])]
    print(
        f"{args.network} batch {args.batch_size}: wall s as given {median(wall[False]):.2f}, channels-last "
        f"{median(wall[True]):.2f} ({median(wall[False]) / median(wall[True]):.2f}x); CPU s {median(cpu[False]):.2f} "
        f"against {median(cpu[True]):.2f}; channels-last faster in {sum(p > 1 for p in pairs)} of {len(pairs)} pairs"
    )


if __name__ == "__main__":
    main()
