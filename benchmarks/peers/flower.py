"""Flower's simulation engine on a peers workload: a `ServerApp` running Flower's own FedAvg strategy (its
message API: `flwr.serverapp.strategy.FedAvg`) and a `ClientApp` whose train function loads the arrays it receives,
runs the workload's client loop (`workloads.train_client`, the plain loop's) and replies with its arrays and sample
count, on the Ray backend with Flower's default client resources. FedPer keeps each client's head in the node's
`context.state` and trains it with the body it receives (Flower ships FedPer as a baseline; its client keeps the
head the same way). A round's seconds run from the strategy's `configure_train` to the end of its `aggregate_train`.
Prints {"round_s": [...]} as one JSON line.

    pip install -e ".[peers]"      # flwr[simulation]: Flower and Ray
    python benchmarks/peers/flower.py --workload fedavg --rounds 5
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time

from workloads import HEAD, WORKLOADS, client_data, network, train_client

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation

WORKLOAD = WORKLOADS[os.environ.get("PEERS_WORKLOAD", "fedavg")]
ROUNDS = int(os.environ.get("PEERS_ROUNDS", "5"))
SECONDS: list[float] = []

client_app = ClientApp()


@client_app.train()
def train(message: Message, context: Context) -> Message:
    """One client's local epoch from the arrays received (FedPer: with its own head, kept in `context.state`)."""
    client = int(context.node_config["partition-id"])
    net = network()
    net.load_state_dict(message.content["arrays"].to_torch_state_dict())
    if WORKLOAD.method == "fedper" and "head" in context.state:
        net.load_state_dict(context.state["head"].to_torch_state_dict(), strict=False)
    x, y = client_data(client, WORKLOAD.samples)
    train_client(net, x, y, WORKLOAD, seed=1000 * int(message.content["config"]["round"]) + client)
    state = net.state_dict()
    if WORKLOAD.method == "fedper":
        context.state["head"] = ArrayRecord({k: state[k] for k in HEAD})
    reply = RecordDict({"arrays": ArrayRecord(state), "metrics": MetricRecord({"num-examples": len(y)})})
    return Message(content=reply, reply_to=message)


class TimedFedAvg(FedAvg):
    """Flower's FedAvg, timing each round from configuring it to the end of its aggregation."""

    def configure_train(self, server_round, arrays, config, grid):
        self.began = time.perf_counter()
        config["round"] = server_round
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        result = super().aggregate_train(server_round, replies)
        SECONDS.append(time.perf_counter() - self.began)
        return result


server_app = ServerApp()


@server_app.main()
def main_server(grid: Grid, context: Context) -> None:
    """The workload's rounds: `per_round` of `clients` nodes a round, no evaluation."""
    strategy = TimedFedAvg(
        fraction_train=WORKLOAD.per_round / WORKLOAD.clients,
        fraction_evaluate=0.0,
        min_train_nodes=WORKLOAD.per_round,
        min_available_nodes=WORKLOAD.clients,
    )
    strategy.start(grid=grid, initial_arrays=ArrayRecord(network().state_dict()), num_rounds=ROUNDS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), required=True)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    global WORKLOAD, ROUNDS
    WORKLOAD, ROUNDS = WORKLOADS[args.workload], args.rounds
    # Ray's workers import this file and read these: they inherit the environment of the process that starts Ray
    os.environ["PEERS_WORKLOAD"], os.environ["PEERS_ROUNDS"] = args.workload, str(args.rounds)
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    logging.getLogger("flwr").setLevel(logging.WARNING)
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=WORKLOAD.clients)
    print(json.dumps({"round_s": SECONDS}))


if __name__ == "__main__":
    main()
