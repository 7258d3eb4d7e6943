"""The clients' training losses the scoring selectors compare (power-of-choice, Oort), measured on the candidates
alone: each under its cluster's current model (`Algorithm.models[assignment[c]]`, the server state's general form;
personal entries are not written in), one pass over their training rows per cluster model."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def loss_statistics(server: Any, algorithm: Any, clients: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """((len(clients),) mean per-sample cross-entropy, (len(clients),) root mean square of it) of each of `clients`
    on its training split under its cluster's model (`server`: the `ServerContext`); NaN for a client without
    training samples."""
    clients = np.asarray(clients, dtype=np.int64)
    clusters = algorithm.assignment[torch.as_tensor(clients, device=algorithm.assignment.device)].cpu().numpy()
    mean, root_mean_square = np.full(len(clients), np.nan), np.full(len(clients), np.nan)
    for cluster in np.unique(clusters):
        rows = np.flatnonzero(clusters == cluster)
        members = clients[rows]
        losses, owner = server.clients.sample_losses(algorithm.models[int(cluster)][None], members.tolist())
        position = torch.full((server.num_clients,), -1, dtype=torch.long, device=owner.device)
        position[torch.as_tensor(members, device=owner.device)] = torch.arange(len(members), device=owner.device)
        at = position[owner]
        counts = torch.bincount(at, minlength=len(members)).double()
        sums = torch.bincount(at, weights=losses[0].double(), minlength=len(members))
        squares = torch.bincount(at, weights=losses[0].double() ** 2, minlength=len(members))
        mean[rows] = (sums / counts).cpu().numpy()
        root_mean_square[rows] = (squares / counts).sqrt().cpu().numpy()
    return mean, root_mean_square
