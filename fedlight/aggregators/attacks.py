"""Attackers, to test robust aggregation and clustering (the `attack:` section of a run config).

A share `attack.fraction` of the clients is malicious: the same clients every round, drawn once from (seed,
"attack"), marked in clients.csv (`malicious`). What they do depends on `attack.kind`:

- data attacks change their training rows once, after loading, so they work with any data module:
  `label_flip` (label l becomes C - 1 - l) and `backdoor` (a trigger pattern on a share of their rows, relabelled
  to `attack.target`; "How To Backdoor Federated Learning", Bagdasaryan et al., AISTATS 2020, section 3);
- update attacks change the models they send, after honest local training (the `tamper` hook):
  `sign_flip` (the update times -s), `scale` (the update times s: model replacement, Bagdasaryan et al., section
  3.2) and `gaussian` (a random update, every entry N(0, s^2); "Machine Learning with Adversaries", Blanchard et
  al., NeurIPS 2017, section 5).

What the run reports: `<split>/backdoor_success` (the share of honest clients' evaluation samples, of another label
than the target, that their own model classifies as the target once the trigger is on; `<split>/backdoor_baseline`
is the same share without the trigger), and
`cluster/ari_attackers`, the ARI of the algorithm's clustering against the true clusters with the attackers as one
more cluster of their own (did the clustering isolate them?).

`Attack` is a round extension (`fedlight.engine.extensions`): the federation calls its hooks and never names it.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from fedlight.plugin.data import ClientSplit, FederatedData
from fedlight.plugin.extension import ExtensionContext, RoundExtension
from fedlight.aggregators.config import AttackConfig, DATA_ATTACKS, DEFAULT_SCALE, UPDATE_ATTACKS

if TYPE_CHECKING:
    from fedlight.engine.evaluator import Evaluator


def apply_trigger(x: Tensor, value: float, size: int) -> Tensor:
    """A copy of the samples `x` with the trigger on: the bottom-right size x size square of the last two dimensions
    (a sample with two or more dimensions), else the last `size` features, set to `value`."""
    x = x.clone()
    if x.dim() >= 3:
        x[..., -size:, -size:] = value
    else:
        x[:, -size:] = value
    return x


class Attack(RoundExtension):
    """The malicious clients of a run and what they do; `seed_parts` is the run's (seed, "attack") stream. As a
    round extension: the data attacks in `prepare_data`, the update attacks in `tamper`, `cluster/ari_attackers`,
    the `malicious` column and, for a backdoor, `<split>/backdoor_success` and `<split>/backdoor_baseline`."""

    name = "attack"

    def __init__(self, config: AttackConfig, num_clients: int, num_classes: int, seed_parts: list[int]) -> None:
        self.config, self.num_classes, self.seed_parts = config, num_classes, seed_parts
        count = round(config.fraction * num_clients)
        if not 0 < count < num_clients:
            raise ValueError(
                f"attack.fraction {config.fraction} of {num_clients} clients makes {count} attackers: "
                f"choose a share that makes between 1 and {num_clients - 1}"
            )
        if config.kind == "backdoor" and not 0 <= config.target < num_classes:
            raise ValueError(f"attack.target must be a label in 0..{num_classes - 1}, got {config.target}")
        rng = np.random.default_rng([*seed_parts, 0])
        self.malicious = np.sort(rng.choice(num_clients, size=count, replace=False))
        self.is_malicious = np.zeros(num_clients, dtype=bool)
        self.is_malicious[self.malicious] = True
        self.scale = config.scale if config.scale is not None else DEFAULT_SCALE.get(config.kind or "", 1.0)
        self.trigger_value = 1.0
        self.true_clusters: np.ndarray | None = None  # the clients' true clusters, once the data is prepared
        self.evaluator: "Evaluator | None" = None  # the training clients' evaluator, once set up
        self.split = "test"

    def describe(self) -> str:
        return f"attack {self.config.kind} by {len(self.malicious)} clients"

    # -- data attacks ----------------------------------------------------------------------------------------
    def prepare_data(self, data: FederatedData) -> FederatedData:
        """The data the run trains on: the attackers' rows poisoned, the true clusters kept for the ARI."""
        self.true_clusters = data.cluster_labels
        return self.poison(data)

    def setup(self, context: ExtensionContext) -> None:
        self.evaluator, self.split = context.evaluator, context.config.eval_split

    def poison(self, data: FederatedData) -> FederatedData:
        """The data with the attackers' training rows changed (label_flip, backdoor); other kinds: unchanged."""
        kind, train = self.config.kind, data.train
        self.trigger_value = float(train.x.max()) if len(train.x) else 1.0
        if kind not in DATA_ATTACKS:
            return data
        x, y = train.x.clone(), train.y.clone()
        rng = np.random.default_rng([*self.seed_parts, 1])
        for client in self.malicious.tolist():
            lo, hi = train.bounds[client], train.bounds[client + 1]
            if kind == "label_flip":
                y[lo:hi] = self.num_classes - 1 - y[lo:hi]
                continue
            count = math.ceil(self.config.poison_fraction * (hi - lo))
            rows = torch.as_tensor(lo + rng.choice(hi - lo, size=count, replace=False), device=x.device)
            x[rows] = apply_trigger(x[rows], self.trigger_value, self.config.trigger_size)
            y[rows] = self.config.target
        return replace(data, train=ClientSplit(x, y, train.bounds))

    # -- update attacks --------------------------------------------------------------------------------------
    def tampers(self) -> bool:
        """Whether the attack changes the updates the attackers send (an update attack) rather than the data they train
        on."""
        return self.config.kind in UPDATE_ATTACKS

    def tamper(self, round: int, clients: list[int], starts: Tensor, params: Tensor) -> Tensor:
        """The models the round's `clients` send: the attackers' rows replaced by their attack on the update (an
        update attack; a data attack sends what it trained)."""
        rows = [i for i, c in enumerate(clients) if self.is_malicious[c]] if self.tampers() else []
        if not rows:
            return params
        params = params.clone()
        s, kind = self.scale, self.config.kind
        for i in rows:
            update = params[i] - starts[i]
            if kind == "sign_flip":
                update = -s * update
            elif kind == "scale":
                update = s * update
            else:
                generator = torch.Generator(device=params.device)
                generator.manual_seed(
                    int(np.random.SeedSequence([*self.seed_parts, 2, round, clients[i]]).generate_state(1)[0])
                )
                update = s * torch.randn(update.shape, generator=generator, device=params.device, dtype=params.dtype)
            params[i] = starts[i] + update
        return params

    # -- what the run reports --------------------------------------------------------------------------------
    def client_columns(self) -> dict[str, np.ndarray]:
        """clients.csv's `malicious` column (1 for an attacker)."""
        return {"malicious": self.is_malicious.astype(np.float64)}

    def cluster_scores(self, clusters: np.ndarray | None) -> dict[str, float]:
        """`cluster/ari_attackers` of a clustering (none when the algorithm does not cluster)."""
        return (
            {} if clusters is None else {"cluster/ari_attackers": self.ari_with_attackers(self.true_clusters, clusters)}
        )

    def evaluate(
        self, round: int, models: tuple, clusters: np.ndarray | None
    ) -> tuple[dict[str, float], dict[str, np.ndarray]]:
        """A backdoor's `<split>/backdoor_success` and `<split>/backdoor_baseline` of the evaluation models."""
        if self.config.kind != "backdoor":
            return {}, {}
        assert self.evaluator is not None  # set up before the first evaluation
        success, baseline = self.backdoor_success(self.evaluator, models, self.split)
        return {f"{self.split}/backdoor_success": success, f"{self.split}/backdoor_baseline": baseline}, {}

    def ari_with_attackers(self, true_clusters: np.ndarray | None, predicted: np.ndarray) -> float:
        """ARI of `predicted` against the true clusters with the attackers as one more cluster of their own (honest
        clients in one cluster when the data defines none)."""
        from fedlight.cluster.scores import clustering_scores  # scikit-learn takes a second to load: only when scored

        truth = np.zeros(len(predicted), dtype=np.int64) if true_clusters is None else np.asarray(true_clusters).copy()
        truth[self.is_malicious] = truth.max() + 1
        return clustering_scores(truth, predicted)["ari"]

    @torch.no_grad()
    def backdoor_success(
        self, evaluator: "Evaluator", models_and_groups: tuple[Any, Tensor], split: str
    ) -> tuple[float, float]:
        """(success, baseline): the share of honest clients' `split` samples of another label than the target that
        their own evaluation model classifies as the target once the trigger is on, and without it (a model that
        predicts the target for much of anything scores high on both: the gap is the backdoor's)."""
        data, client_of_row = evaluator.data.split(split), evaluator.server.clients.client_of_row(split)
        honest = torch.as_tensor(~self.is_malicious, device=client_of_row.device)
        keep = (data.y != self.config.target) & honest[client_of_row]
        if not bool(keep.any()):
            return math.nan, math.nan
        clean = data.x[keep]
        triggered = apply_trigger(clean, self.trigger_value, self.config.trigger_size)
        models, group_of_client = models_and_groups
        groups = group_of_client[client_of_row[keep]]
        as_target = [0, 0]  # samples classified as the target: with the trigger, without
        for group in torch.unique(groups).tolist():
            rows = groups == group
            for i, x in enumerate((triggered, clean)):
                as_target[i] += int(
                    (evaluator.outputs(models[group], x[rows]).argmax(dim=1) == self.config.target).sum()
                )
        return as_target[0] / len(clean), as_target[1] / len(clean)

    def state_dict(self) -> dict[str, Any]:
        """The attackers (`malicious`, client indices), for `load_state_dict` to check a resumed run against."""
        return {"malicious": self.malicious.tolist()}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """A resumed run must have the same attackers (they are a function of the seed): refuse another set."""
        if state is not None and list(state["malicious"]) != self.malicious.tolist():
            raise ValueError(
                f"the checkpoint's attackers {state['malicious']} differ from this run's "
                f"{self.malicious.tolist()}: resume with the run's own attack settings"
            )
