"""The plain PyTorch loop on a peers workload: one `nn.Module`, a client's state dict loaded, trained and read back,
one client after another, the states averaged by training-set size (FedPer: all but the head, which each client
keeps). Prints {"round_s": [...]} as one JSON line.

    python benchmarks/peers/plain.py --workload fedavg --rounds 5
"""

from __future__ import annotations

import time

import torch

from workloads import print_rounds, HEAD, Workload, client_data, clients_of_round, network, train_client


def run(workload: Workload, rounds: int) -> list[float]:
    """Seconds of each of `rounds` rounds."""
    net = network()
    global_state = {k: v.clone() for k, v in net.state_dict().items()}
    heads: dict[int, dict[str, torch.Tensor]] = {}
    seconds = []
    for number in range(1, rounds + 1):
        began = time.perf_counter()
        states, sizes = [], []
        for client in clients_of_round(workload, number):
            x, y = client_data(client, workload.samples)
            net.load_state_dict(global_state)
            if workload.method == "fedper" and client in heads:
                net.load_state_dict(heads[client], strict=False)
            train_client(net, x, y, workload, seed=1000 * number + client)
            state = {k: v.clone() for k, v in net.state_dict().items()}
            if workload.method == "fedper":
                heads[client] = {k: state[k] for k in HEAD}
            states.append(state)
            sizes.append(len(y))
        total = sum(sizes)
        global_state = {k: sum(s[k] * (n / total) for s, n in zip(states, sizes)) for k in states[0]}
        seconds.append(time.perf_counter() - began)
    return seconds


if __name__ == "__main__":
    print_rounds(run, __doc__)
