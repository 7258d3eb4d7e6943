"""StoCFL ("Stochastic Clustered Federated Learning", Dun Zeng, Xiangjing Hu, Shiyu Liu, Yue Yu, Qifan Wang and
Zenglin Xu, 2023, arXiv 2303.00897): clients are clustered as they are sampled, and each cluster's model is trained
by its members with a proximal pull towards one global model (a bi-level objective).

Every rule below is cited from the authors' implementation (dunzeng/StoCFL: `StoCFL-FCC+CFL.py`, the bi-level
script, its `StandaloneServer.main`, `inter_cluster_union`, `unite`, `bucket`; `trainer.py`'s `observe`, `ob_train`,
`train`, `train_alone_prox`, `_train_alone`; the README's commands); the paper's text beyond its abstract was not at
hand. FedRC's baseline of it (LINs-lab/FedRC, `aggregator.py`, `STOCFLAggregator`) was read beside it. As that code
runs it:
- representation (`observe`): a client sampled for the first time trains a fixed anchor model, the run's initial
  model, for `observe_epochs` epochs on its data; its representation is psi = anchor - trained, the direction of
  its data's gradient at the anchor. It is computed once per client, and the client forms a cluster of its own
  whose model is a copy of the global model;
- merge rule (`inter_cluster_union`): among the clusters with a member in the round, every pair whose
  representations have cosine similarity >= tau is united, transitively (the code sorts the pairs and unites down
  to the first below tau: the connected components of the graph of pairs >= tau); a cluster's representation is
  the mean of its members' psi; the merged cluster keeps the model of its larger part (`unite`);
- bi-level training (`train`): each of the round's clients trains its cluster model theta_k on its loss plus
  (lambda / 2) ||theta_k - omega||^2, omega the global model it received (`train_alone_prox`, the parameters only),
  and the global model omega on its loss alone (`_train_alone`); the global model becomes the mean of the round's
  trained copies, each cluster model the mean of its round members' trained copies;
- clustering first, then training, in every round (`main`).
Defaults: tau 0.65, lambda 0.05 (`--tau`, `--mu`) and 20 observation epochs (`--obep`), the README's command for
this script (rotated CIFAR-10, 5 local epochs, batch 50, lr 0.1; the script's own argparse defaults are tau 0.3 and
10 observation epochs); the local epochs are the run's. tau depends on the model and data: on the digits rotations
with the tests' network a client's psi has cosine 0.8-0.95 with its own rotation's and 0.3-0.4 with the other's (tau
0.3 would merge everything); with configs/digits' network and momentum, 0.59-0.75 and 0.13-0.40 (that config sets
0.5).

Deviations:
- a cluster's representation is the mean of all its members' psi (kept per cluster with its member count, so no
  client's psi is stored); the code compares the means of the round's sampled members only. FedRC's baseline also
  averages every member;
- the global copies are trained from omega, each client alone, and averaged (FedAvg); the code's loop hands each
  client the previous client's trained global model (`gmodel = self._train_alone(gmodel, ...)`), a chain;
- the means are the engine's cluster aggregator (training-set-size weights, or the run's robust rule or DP: each
  client adds two rows, its cluster copy and its global copy, `rows_per_client` 2); the code's means are unweighted;
- the observation and local training use the module's optimizer and batch size (the code: SGD, `--obbs`);
- the proximal term's gradient is added on the whole flat model (buffers receive no optimizer step, so only the
  parameters move by it), and the representation is read on the parameter entries only, as the code's;
- a client not yet sampled has no cluster: it is evaluated with the global model and labelled 0 in
  `cluster_labels()` (row 0 of `models` is the global model, rows 1.. the clusters, compacted after each merge);
- an update attack tampers with both copies a client sends, each against the model it was trained from (the global
  copy is declared trained from omega, `fedlight.plugin.message`);
- a client that arrives after training computes its psi at the anchor and joins the cluster of most similar
  representation when that similarity is >= tau, else it is evaluated with the global model (the paper's newly
  joined clients; not in the code).

Memory: each cluster holds a model row and a representation row on the device, so a run whose clusters do not merge
(tau too high) holds two rows for every client sampled so far; the run logs `cluster/count`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components
from torch import Tensor

from fedlight.cluster.similarity import cosine_similarity_matrix
from fedlight.plugin import MODEL, Algorithm, Newcomers, RoundUpdates, Trained, unit_rows

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext

GLOBAL = 0  # the row of `models` holding the global model omega; the clusters are rows 1..
GLOBAL_COPY = "global_copy"  # what a client sends beside its cluster copy: its trained copy of omega


def merge_components(similarity: Tensor, tau: float) -> np.ndarray:
    """Component label of each of m clusters given their (m, m) similarity: clusters joined by a chain of pairs with
    similarity >= tau share a label (the code's sorted unions down to the first pair below tau)."""
    edges = (similarity >= tau).cpu().numpy()
    return connected_components(csr_matrix(edges), directed=False)[1]


def pooled_mean(representations: Tensor, members: Tensor) -> Tensor:
    """The mean of every member's psi, from the clusters' means `representations` (rows) and member counts."""
    weights = members.to(representations.dtype)
    return (weights[:, None] * representations).sum(dim=0) / weights.sum()


def proximal_gradient(params: Tensor, global_model: Tensor, lam: float) -> Tensor:
    """The gradient of (lambda / 2) ||theta - omega||^2 at the rows theta: lambda (theta - omega)."""
    return lam * (params - global_model)


class StoCFL(Algorithm):
    """Clients clustered as they are first sampled, by the cosine similarity of their gradient directions at a fixed
    anchor; cluster models trained with a proximal pull towards a global model trained by every client.

    Args:
        tau: the merge threshold on the cosine similarity of two clusters' representations, in [-1, 1].
        lam: lambda >= 0, the proximal weight pulling each cluster model towards the global model (0: the clusters
            train alone).
        observe_epochs: local epochs of a new client's training of the anchor (its representation).
        participation: share of clients per round (or the federation's `clients_per_round`).
    """

    def __init__(
        self, tau: float = 0.65, lam: float = 0.05, observe_epochs: int = 20, participation: float = 1.0
    ) -> None:
        super().__init__(participation)
        if not -1 <= tau <= 1:
            raise ValueError(
                f"algorithm.init_args.tau must be in [-1, 1] (a cosine similarity), got {tau}: give a "
                "threshold such as 0.65"
            )
        if not lam >= 0:
            raise ValueError(
                f"algorithm.init_args.lam must be >= 0 (the proximal weight), got {lam}: give 0 or more, such as 0.05"
            )
        if observe_epochs < 1:
            raise ValueError(
                f"algorithm.init_args.observe_epochs must be >= 1, got {observe_epochs}: give the epochs "
                "a new client trains the anchor for, such as 20"
            )
        self.tau, self.lam, self.observe_epochs = tau, lam, observe_epochs

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        server.message.sends(
            GLOBAL_COPY,
            MODEL,  # trained from omega, the global model
            trained_from=lambda clients: self.models[GLOBAL].expand(len(clients), -1),
        )
        self.entries = server.model.parameter_mask()  # the representation's entries: the parameters, not buffers
        self.representations = self.models.new_zeros(1, int(self.entries.sum()))  # a row per row of models
        self.members = torch.zeros(1, dtype=torch.long, device=server.device)  # clients in each row

    # -- clustering ------------------------------------------------------------------------------------------
    def begin_round(self, round: int) -> None:
        """The round's new clients observe the anchor and form clusters of their own; then the round's clusters
        merge by the similarity of their representations."""
        clients = self.select_clients(round)
        new = [c for c in clients if int(self.assignment[c]) == GLOBAL]
        if new:
            self.open_clusters(new, self.observe(round, new))
        self.merge(sorted(set(self.assignment[clients].tolist())))

    def observe(self, round: int, clients: list[int]) -> Tensor:
        """(len(clients), parameters) each client's psi = anchor - its model after `observe_epochs` from the anchor."""
        anchor = self.server.model.initial_params
        trained = self.server.clients.train_many(
            round, clients, anchor.expand(len(clients), -1), epochs=self.observe_epochs, purpose="stocfl-observe"
        )
        return (anchor - trained.params)[:, self.entries]

    def open_clusters(self, clients: list[int], psi: Tensor) -> None:
        """A cluster of its own for each client, its representation psi and its model a copy of the global model."""
        first = len(self.models)
        self.models = torch.cat([self.models, self.models[GLOBAL].expand(len(clients), -1)])
        self.representations = torch.cat([self.representations, psi.to(self.representations.dtype)])
        self.members = torch.cat([self.members, torch.ones_like(self.members[:1]).expand(len(clients))])
        self.assignment[torch.as_tensor(clients, device=self.assignment.device)] = torch.arange(
            first, first + len(clients), device=self.assignment.device
        )

    def merge(self, rows: list[int]) -> None:
        """Unite the clusters `rows` joined by pairs of similarity >= tau; each union keeps the model of its largest
        part (the oldest on a tie) and the mean of every member's psi; the rows are then compacted."""
        if len(rows) < 2:
            return
        similarity = cosine_similarity_matrix(self.representations[rows])
        self.log_matrix("cluster_representation_similarity", similarity)
        labels = merge_components(similarity, self.tau)
        target = torch.arange(len(self.models), device=self.assignment.device)
        for component in np.unique(labels):
            parts = torch.as_tensor([rows[i] for i in np.flatnonzero(labels == component)], device=target.device)
            if len(parts) < 2:
                continue
            keep = parts[int(torch.argmax(self.members[parts]))]  # argmax takes the first, lowest row, on a tie
            self.representations[keep] = pooled_mean(self.representations[parts], self.members[parts])
            self.members[keep] = self.members[parts].sum()
            target[parts] = keep
        if bool((target != torch.arange(len(target), device=target.device)).any()):
            self.compact(target)

    def compact(self, target: Tensor) -> None:
        """Rows that were united into another (`target[row] != row`) removed; every client relabelled."""
        kept = target == torch.arange(len(target), device=target.device)
        renumber = torch.cumsum(kept.long(), dim=0) - 1
        self.assignment = renumber[target[self.assignment]]
        self.models, self.representations, self.members = (
            self.models[kept],
            self.representations[kept],
            self.members[kept],
        )

    # -- bi-level training -----------------------------------------------------------------------------------
    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """Each client trains its cluster model with the proximal pull towards omega (the `Trained`'s models), and
        omega alone (sent beside, `global_copy`), on the same batches."""
        omega, lam, scale = self.models[GLOBAL], self.lam, self.learning_rate_scale(round)

        def pull(rows: list[int], params: Tensor, grad: Tensor, _: Tensor) -> None:
            grad += proximal_gradient(params, omega, lam)

        trained = self.server.clients.train_many(
            round, clients, starts, lr_scale=scale, gradient_hook=pull if lam else None
        )
        global_copies = self.server.clients.train_many(
            round, clients, omega.expand(len(clients), -1), lr_scale=scale
        ).params
        trained.state = {**trained.state, GLOBAL_COPY: global_copies}
        return trained

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        """Each cluster model the weighted mean of its round members' cluster copies, the global model that of
        every round client's global copy, through the run's cluster aggregator (two rows a client)."""
        k, d = self.models.shape
        average = self.server.aggregation.new(k, d, self.models.dtype, self.models.device, rows_per_client=2)
        for group in updates.groups():
            weights = group.num_samples.to(self.models.dtype)
            copies = group.state.pop(GLOBAL_COPY)
            omega = self.models[GLOBAL].expand(len(group), -1) if average.reads_starts else None
            average.add(self.assignment[group.clients], weights, group.params, group.starts)
            average.add(torch.full_like(group.clients, GLOBAL), weights, copies, omega)
            del group, copies
        average.reduce(updates)
        self.set_shared(*average.means())

    # -- evaluation ------------------------------------------------------------------------------------------
    def newcomer_models(self, newcomers: Newcomers) -> tuple[Tensor, Tensor, Tensor]:
        """Each newcomer's psi at the anchor; it joins the cluster of most similar representation when that is
        >= tau, else it gets the global model (label 0)."""
        anchor, count = self.server.model.initial_params, newcomers.count
        trained = newcomers.train_many(
            list(range(count)), anchor.expand(count, -1), epochs=self.observe_epochs, purpose="stocfl-observe"
        )
        groups = torch.full((count,), GLOBAL, dtype=torch.long, device=self.models.device)
        if len(self.models) > 1:
            psi = (anchor - trained)[:, self.entries].to(self.representations.dtype)
            similarity = unit_rows(psi) @ unit_rows(self.representations[1:]).T
            best, row = similarity.max(dim=1)
            groups = torch.where(best >= self.tau, row + 1, groups)
        return self.models, groups, groups

    def cluster_labels(self) -> np.ndarray:
        return self.assignment.cpu().numpy()

    def round_metrics(self) -> dict[str, float]:
        return {"cluster/count": float(len(self.models) - 1)}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "representations": self.representations, "members": self.members}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.representations, self.members = state["representations"], state["members"]
