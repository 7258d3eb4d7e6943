"""Client-level differential privacy (the `privacy:` section of a run config): DP-FedAvg, adaptive clipping, and
Opacus's accountant.

DP-FedAvg ("Learning Differentially Private Recurrent Language Models", McMahan et al., ICLR 2018, Algorithm 1):
each client's update (trained minus start) is clipped to norm C, every client counts once, and Gaussian noise
N(0, z^2 C^2) is added to each cluster's sum of clipped updates before it is divided by the cluster's member count.
A client belongs to one cluster, so the clusters' sums are one Gaussian mechanism of sensitivity C per round (their
concatenation), and the accountant steps once per round. Weights: every client counts once (the weighted
estimators of McMahan et al., section 2, need weights capped in advance).

The unit of privacy is the client, also when a client sends one row to each of r clusters (FedEM: a copy of every
component, `rows_per_client` = r): each row is clipped to C / sqrt(r), so the client's rows together have norm at
most C (McMahan et al.'s per-layer clipping, the bound split equally), the concatenated sums are still one Gaussian
mechanism of sensitivity C with noise z C, and the accountant steps once a round at the clients' sample rate. For
adaptive clipping a row within its clip counts 1 / r, so each client adds at most 1 to the count, as with one row.

Adaptive clipping ("Differentially Private Learning with Adaptive Clipping", Andrew et al., NeurIPS 2021, Algorithm
1 and Theorem 1): the clip follows the `target_quantile` of the update norms, C <- C exp(-eta (b - gamma)), where b
is the share of clients whose norm was within C, counted with noise N(0, sigma_b^2) (sigma_b = clients per round /
20 by default, as the paper's experiments). The privacy of the pair is that of one Gaussian mechanism of noise z
when the updates get z_update = (z^-2 - (2 sigma_b)^-2)^-1/2, so `noise_multiplier` stays the one accounted.

The accountant is Opacus's (`RDPAccountant` or `PRVAccountant`) for the sampled Gaussian mechanism, with sample
rate = clients selected per round / clients. Clients are drawn as a fixed-size sample, not Poisson: the usual
approximation (McMahan et al., section 3). `privacy/epsilon` is logged for `delta` every round; its history is part of
the checkpoint. The guarantee covers the released cluster models: the server is trusted, and what it computes from
the raw updates before aggregating (a clustering, a trigger) is not privatized, nor is a model an algorithm writes
from raw trained models itself (IFCA's warm-up seeding). The member count a noised sum is divided by is not noised
either (McMahan et al.'s fixed-denominator estimator would divide by the expected count instead).

The accounting follows how a round's clients are chosen (`fedlight.plugin.cohort.Sampling`, from the run's
extensions). Amplification by sampling holds only for a uniform sample drawn independently of the clients' data: every
client, or the run's uniform draw (`system.availability` "always" or "share", `system.selection` "uniform"; deadlines
and dropouts only leave out some of its clients). A selection that reads the clients' data (power-of-choice and Oort
pick by training losses, which reach the server unnoised) is refused at set-up. Any other way of choosing them is
accounted per client (`account_each_client`), with no amplification: FedBuff's arrivals (who arrives follows the
devices' speeds and the clients in flight), a selection by data size or by the algorithm's clusters, an availability
pattern (periods, diurnal, a trace). A client whose clipped update entered r noised sums then has the guarantee of r
Gaussian mechanisms of noise z and sensitivity C composed, and the run's `privacy/epsilon` is that of the client
released most often (`privacy/most_releases`). In a uniformly sampled run, a round whose clients are not the run's
draw (an algorithm that picks its own: SR-FCA among its kept clusters, FedSoft by importance) is accounted per client
too (`privacy/unsampled_rounds`), and the worst client's epsilon composes the sampled rounds with its releases in
those. A client counted in a round its update was left out of (a non-finite update) only loosens the bound. The start
line and summary.json (`privacy.accounting`: "sampled", "each client", or "sampled, N rounds per client") say which
ran. Under FedBuff a stale update is handed to the aggregation re-based (start + s(tau) x change,
`fedlight.system.buffered`), so its clipped row is s(tau) x change clipped to C: the sensitivity stays C.
`target_epsilon` alone chooses the noise for the accounting known at set-up: with per-client accounting, one that
keeps a client released in every round within it.

Opacus is imported only when a run turns privacy on, so starting the command line stays fast.

`PrivacyMechanism` is a round extension (`fedlight.engine.extensions`): it puts itself into the run's cluster
aggregation, steps the accountant at the end of every round and stops the run at its budget; the federation calls
its hooks and never names it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from fedlight.plugin.aggregation import ClusterAverage
from fedlight.aggregators.cluster_aggregator import ClusterAggregation, add_starts, member_updates
from fedlight.plugin.extension import ExtensionContext, RoundExtension
from fedlight.plugin.message import PER_CLIENT, SUMMED, MessageSchema
from fedlight.aggregators.robust import clip_rows
from fedlight.aggregators.config import PrivacyConfig

if TYPE_CHECKING:
    from fedlight.plugin.round_updates import RoundUpdates


def quiet_accounting() -> None:
    """Inside `warnings.catch_warnings()`: silence what Opacus says on every call that is no news for a run (PRV's
    log(0) at a sample rate of 1, harmless; RDP's optimal order at the end of its range, which only loosens the
    bound), so a run does not print it every round."""
    warnings.simplefilter("ignore", RuntimeWarning)
    warnings.filterwarnings("ignore", message="Optimal order is the (smallest|largest) alpha")


def make_accountant(kind: str) -> Any:
    """A fresh Opacus accountant ("rdp" or "prv")."""
    from opacus.accountants import PRVAccountant, RDPAccountant

    return RDPAccountant() if kind == "rdp" else PRVAccountant()


def epsilon_of(accountant: Any, delta: float, eps_error: float = 0.01) -> float:
    """The accountant's epsilon at `delta` (0 before any step). PRV's is an upper bound within `eps_error` of the
    exact value (Opacus's default 0.01; smaller is slower)."""
    if not accountant.history:
        return 0.0
    extra = {"eps_error": eps_error} if accountant.mechanism() == "prv" else {}
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        quiet_accounting()
        return float(accountant.get_epsilon(delta=delta, **extra))


def noise_for_epsilon(target_epsilon: float, delta: float, sample_rate: float, steps: int, kind: str) -> float:
    """The noise multiplier that reaches `target_epsilon` after `steps` rounds (Opacus's search)."""
    from opacus.accountants.utils import get_noise_multiplier

    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        quiet_accounting()
        return float(
            get_noise_multiplier(
                target_epsilon=target_epsilon, target_delta=delta, sample_rate=sample_rate, steps=steps, accountant=kind
            )
        )


def update_noise(z: float, count_noise: float) -> float:
    """z_update of adaptive clipping (Andrew et al., Theorem 1): the updates' noise multiplier that, with noise
    `count_noise` on the count, makes the pair as private as one Gaussian mechanism of noise z."""
    if z >= 2 * count_noise:
        raise ValueError(
            f"privacy.noise_multiplier {z:.3g} leaves no noise for the updates with adaptive clipping at "
            f"count noise {count_noise:.3g} (it must be below 2 x count noise): raise privacy.count_noise "
            f"above {z / 2:.3g} or turn privacy.adaptive off"
        )
    return (z**-2 - (2 * count_noise) ** -2) ** -0.5


class PrivacyMechanism(RoundExtension):
    """The run's DP state: the noise multiplier, the clip (adaptive or fixed), the accountant; it hands out the
    aggregators that clip and noise (`PrivateClusterAggregate`) and accounts each round's release, with amplification
    by sampling when the round's clients were a uniform draw and per client otherwise (the module docstring). Its
    state (the sampled steps, each client's other releases, the clip) is saved under `privacy` in the checkpoint."""

    name = "privacy"

    def __init__(
        self, config: PrivacyConfig, rounds: int, clients_per_round: int, num_clients: int, seed_parts: list[int]
    ) -> None:
        self.config, self.seed_parts, self.num_clients, self.rounds = config, seed_parts, num_clients, rounds
        self.sample_rate = clients_per_round / num_clients
        if config.noise_multiplier is None:
            assert config.target_epsilon is not None  # PrivacyConfig asks for one of the two
            self.noise_multiplier = noise_for_epsilon(
                config.target_epsilon, config.delta, self.sample_rate, rounds, config.accountant
            )
            self.stop_at = None
        else:
            self.noise_multiplier = config.noise_multiplier
            self.stop_at = config.target_epsilon
        self.count_noise = config.count_noise or clients_per_round / 20
        self.update_noise = (
            update_noise(self.noise_multiplier, self.count_noise) if config.adaptive else self.noise_multiplier
        )
        assert config.clip is not None  # PrivacyConfig requires it
        self.clip = float(config.clip)
        self.accountant = make_accountant(config.accountant)  # the rounds accounted as sampled Gaussian mechanisms
        self.round, self.calls, self.released = 0, 0, False
        self.within_clip: tuple[float, float] | None = None  # (updates within the clip, updates) of the round
        # each client's noised sums in rounds accounted per client
        self.releases = np.zeros(num_clients, dtype=np.int64)
        self.each_client: str | None = None  # why every round is accounted per client (set at set-up), or None
        self.unsampled_rounds = 0  # rounds of a sampled run accounted per client: their clients were not the draw
        self.round_clients: set[int] = set()  # the clients whose updates the round's noised sums took
        self.round_selected: list[int] | None = None  # the round's clients as the algorithm selected them
        self._drawn: Callable[[int], list[int] | None] = lambda round: None  # the run's uniform draw of a round

    def setup(self, context: ExtensionContext) -> None:
        """Refuse a selection that reads the clients' data (a loss-driven one); account each client's releases when
        the run's cohorts are no uniform draw (`context.sampling`: FedBuff's arrivals, a non-uniform availability
        or selection); keep the run's draw of each round to check the algorithm's own selection against."""
        sampling = context.sampling
        if sampling.reads_data:
            raise ValueError(
                f"privacy: {sampling.why}, so who trains depends on their data and {sampling.reads_data} "
                "reach the server unnoised, outside any DP guarantee: use system.selection uniform or "
                "data_size with privacy, or leave privacy out"
            )
        if not sampling.uniform:
            self.account_each_client(sampling.why)
        self._drawn = context.server.cohort.drawn

    def check_message(self, schema: MessageSchema, algorithm: str) -> None:
        """Refuse a message with an entry DP does not clip and noise: a statistic summed over clients or a value read
        client by client reaches the server (and what it broadcasts) in the clear. A model entry goes through the
        run's cluster aggregator, whose noised sums cover it, as the trained model."""
        unprotected = schema.of_kind(SUMMED, PER_CLIENT)
        if unprotected:
            raise ValueError(
                f"privacy: {algorithm}'s clients send {schema.describe(unprotected[0])} beside their "
                "models, which DP does not clip or noise, so no guarantee would cover it: leave the "
                f"privacy section out for {algorithm}"
            )

    def account_each_client(self, why: str) -> None:
        """Account every round per client, with no amplification by sampling (`why`: how the clients are chosen);
        with `target_epsilon` alone, the noise keeps a client that is released in every round within it."""
        self.each_client = why
        if self.config.noise_multiplier is None:
            assert self.config.target_epsilon is not None  # PrivacyConfig asks for one of the two
            self.noise_multiplier = noise_for_epsilon(
                self.config.target_epsilon, self.config.delta, 1.0, self.rounds, self.config.accountant
            )
            self.update_noise = (
                update_noise(self.noise_multiplier, self.count_noise) if self.config.adaptive else self.noise_multiplier
            )

    def accounting(self) -> str:
        """Which accounting ran: "each client" (every round, no amplification), "sampled" (every round a uniform
        sample, amplified) or "sampled, N rounds per client"."""
        if self.each_client is not None:
            return "each client"
        return f"sampled, {self.unsampled_rounds} rounds per client" if self.unsampled_rounds else "sampled"

    def describe(self) -> str:
        clip = "adaptive clip from" if self.config.adaptive else "clip"
        how = (
            f"each client's releases ({self.each_client})"
            if self.each_client is not None
            else "amplified by uniform sampling"
        )
        return (
            f"DP noise multiplier {self.noise_multiplier:.3g}, {clip} {self.clip:g}, {self.config.accountant} "
            f"accounting {how}"
        )

    def summary(self) -> dict[str, Any]:
        return {
            "privacy": {
                "accounting": self.accounting(),
                "why": self.each_client or "",
                "epsilon": self._epsilon(),
                "delta": self.config.delta,
                "noise_multiplier": self.noise_multiplier,
                "most_releases": int(self.releases.max()),
            }
        }

    def aggregation(self, aggregation: ClusterAggregation) -> ClusterAggregation:
        """The run's aggregation with DP-FedAvg's noised sums in place of the mean."""
        return ClusterAggregation(aggregation.settings, self)

    def begin_round(self, round: int) -> None:
        self.round, self.calls, self.released, self.within_clip = round, 0, False, None
        self.round_clients, self.round_selected = set(), None

    def aggregator(
        self,
        clusters: int,
        dim: int,
        dtype: torch.dtype,
        device: torch.device,
        personal_mask: Tensor | None,
        rows_per_client: int = 1,
    ) -> "PrivateClusterAggregate":
        """A fresh `PrivateClusterAggregate`, numbered by the round's calls so that each draws its own noise."""
        self.calls += 1
        return PrivateClusterAggregate(self, self.calls, clusters, dim, dtype, device, personal_mask, rows_per_client)

    def noise(self, call: int, cluster: int, dim: int, device: torch.device) -> Tensor:
        """N(0, (z_update C)^2) in float64 for one cluster's sum, from a stream of (seed, round, call, cluster): every
        process draws the same, and a resumed run the same as an uninterrupted one."""
        generator = torch.Generator(device=device)
        key = [*self.seed_parts, self.round, call, cluster]
        generator.manual_seed(int(np.random.SeedSequence(key).generate_state(1)[0]))
        draw = torch.randn(dim, generator=generator, device=device, dtype=torch.float64)
        return draw * (self.update_noise * self.clip)

    def took_updates_of(self, updates: "RoundUpdates") -> None:
        """The round's noised sums took the updates of `updates`' clients that sent one, selected as `clients`."""
        self.round_selected = list(updates.clients)
        self.round_clients.update(set(updates.clients) - set(updates.dropped))

    def released_sums(self, within: float, count: float) -> None:
        """An aggregator released noised sums this round; `within` of its `count` updates were inside the clip."""
        self.released = True
        self.within_clip = (within, count)

    def sampled_round(self, round: int) -> bool:
        """Whether round `round`'s release is accounted as a sampled Gaussian mechanism: the run samples uniformly
        and the round's clients are every client or exactly the run's uniform draw of the round (an algorithm that
        picks its own, SR-FCA among its kept clusters, FedSoft by importance, is accounted per client)."""
        if self.each_client is not None:
            return False
        selected = self.round_selected
        if selected is None:  # no aggregator reported its clients: the accountant steps as for the draw
            return True
        chosen = sorted(selected)
        return chosen == list(range(self.num_clients)) or chosen == sorted(self._drawn(round) or [])

    def end_round(self, round: int, clients: int) -> tuple[dict[str, float], str | None]:
        """Account the round's release when the round of `clients` selected clients released sums (sampled, or
        each released client once), adapt the clip, and report: (`privacy/*` scalars, a reason to stop before the
        budget is exceeded or None)."""
        clip_used, num_clients = self.clip, self.num_clients
        sampled = self.sampled_round(round)
        if self.released:
            if sampled:
                self.accountant.step(noise_multiplier=self.noise_multiplier, sample_rate=clients / num_clients)
            else:
                self.releases[sorted(self.round_clients)] += 1
                self.unsampled_rounds += self.each_client is None
            if self.config.adaptive and self.within_clip is not None:  # per client: the share of the released
                self._adapt_clip(clients if sampled else len(self.round_clients))
        epsilon = self._epsilon()
        scalars = {
            "privacy/epsilon": epsilon,
            "privacy/clip": clip_used,
            "privacy/noise_multiplier": self.noise_multiplier,
        }
        if self.each_client is not None or self.unsampled_rounds:
            scalars["privacy/most_releases"] = float(self.releases.max())
        if self.unsampled_rounds:
            scalars["privacy/unsampled_rounds"] = float(self.unsampled_rounds)
        stop = None
        if self.stop_at is not None and self._next_epsilon(clients / num_clients, sampled) > self.stop_at:
            stop = (
                f"privacy.target_epsilon {self.stop_at:g} reached: epsilon {epsilon:.3g} now, another round would "
                "exceed it"
            )
        return scalars, stop

    def _adapt_clip(self, clients: int) -> None:
        """C <- C exp(-eta (b - gamma)), b the noised share of updates within the clip (Andrew et al., Algorithm 1)."""
        assert self.within_clip is not None  # counted in the round
        within, _ = self.within_clip
        rng = np.random.default_rng([*self.seed_parts, self.round, 0])
        share = (within + rng.normal(0.0, self.count_noise)) / max(clients, 1)
        self.clip *= math.exp(-self.config.clip_learning_rate * (share - self.config.target_quantile))

    def _history(self, sample_rate: float | None = None, more_releases: int = 0) -> list[tuple[float, float, int]]:
        """The worst client's mechanisms: every sampled step (and one more at `sample_rate`), then the releases of
        the client released most often in the rounds accounted per client (plus `more_releases`), as that many
        unsampled Gaussian mechanisms. RDP and PRV compose them."""
        history = list(self.accountant.history)
        if sample_rate is not None:
            history.append((self.noise_multiplier, sample_rate, 1))
        most = int(self.releases.max()) + more_releases
        return history + ([(self.noise_multiplier, 1.0, most)] if most else [])

    def _epsilon(self, sample_rate: float | None = None, more_releases: int = 0) -> float:
        worst = make_accountant(self.config.accountant)
        worst.history = self._history(sample_rate, more_releases)
        return epsilon_of(worst, self.config.delta)

    def _next_epsilon(self, sample_rate: float, sampled: bool) -> float:
        """The epsilon after one more round like this one: another sampled step, or one more release of the client
        released most often."""
        return self._epsilon(sample_rate) if sampled else self._epsilon(more_releases=1)

    def state_dict(self) -> dict[str, Any]:
        """The accounting to resume from: the accountant's sampled steps, the clip and noise multiplier now, each
        client's releases and the rounds accounted per client."""
        return {
            "history": [list(step) for step in self.accountant.history],
            "clip": self.clip,
            "noise_multiplier": self.noise_multiplier,
            "releases": self.releases.tolist(),
            "unsampled_rounds": self.unsampled_rounds,
            "sampled_history": True,
        }

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is None:
            return
        releases = state.get("releases")
        # before "sampled_history", a run accounted per client kept its most released client's steps as the history
        per_client_before = releases is not None and not state.get("sampled_history")
        self.accountant.history = [] if per_client_before else [tuple(step) for step in state["history"]]
        self.clip, self.noise_multiplier = float(state["clip"]), float(state["noise_multiplier"])
        if releases is not None:
            self.releases = np.asarray(releases, dtype=np.int64)
        self.unsampled_rounds = int(state.get("unsampled_rounds", 0))


class PrivateClusterAggregate:
    """DP-FedAvg's aggregation within each cluster: clipped updates summed (streamed, and over the processes), the
    sum noised and divided by the members, added to the members' mean start. With `rows_per_client` r > 1 every
    client adds r rows (one to each of r clusters), each clipped to C / sqrt(r) and counted 1 / r."""

    reads_starts = True  # the updates, trained minus start, are clipped

    def __init__(
        self,
        mechanism: PrivacyMechanism,
        call: int,
        clusters: int,
        dim: int,
        dtype: torch.dtype,
        device: torch.device,
        personal_mask: Tensor | None,
        rows_per_client: int = 1,
    ) -> None:
        self.mechanism, self.call, self.dtype, self.personal_mask = mechanism, call, dtype, personal_mask
        self.rows_per_client = rows_per_client
        self.base = ClusterAverage(clusters, dim, dtype, device)
        self.sums = ClusterAverage(clusters, dim, dtype, device)
        self.within = torch.zeros(1, dtype=torch.float64, device=device)

    def add(self, clusters: Tensor, weights: Tensor, values: Tensor, starts: Tensor | None = None) -> None:
        """Rows trained from `starts` (None: `values` are updates); every client counts once whatever its weight."""
        keep = weights > 0
        clusters, values = clusters[keep], values[keep]
        starts = None if starts is None else starts[keep]
        updates = member_updates(values, starts, self.personal_mask)
        clip = self.mechanism.clip / math.sqrt(self.rows_per_client)
        self.within += (updates.double().norm(dim=1) <= clip).sum().double() / self.rows_per_client
        add_starts(self.base, clusters, starts)
        self.sums.add(
            clusters, torch.ones(len(clusters), dtype=torch.float64, device=values.device), clip_rows(updates, clip)
        )

    def reduce(self, updates: "RoundUpdates") -> None:
        """Add the sums, counts and within-clip count over the processes, and tell the mechanism which clients the sums
        took."""
        updates.sum_over_processes_(self.base.sums, self.base.totals, self.sums.sums, self.sums.totals, self.within)
        self.mechanism.took_updates_of(updates)

    def means(self) -> tuple[Tensor, Tensor]:
        """(clusters with a member, their new models): each cluster's clipped sum, noised and divided by its members,
        added to their mean start; the release is reported to the mechanism."""
        active = (self.base.totals > 0).nonzero().flatten()
        base = self.base.sums[active] / self.base.totals[active, None]
        dim, device = self.sums.sums.shape[1], self.sums.sums.device
        noised = (
            torch.stack([self.sums.sums[k] + self.mechanism.noise(self.call, k, dim, device) for k in active.tolist()])
            if len(active)
            else self.sums.sums[active]
        )
        count = self.sums.totals[active, None]
        self.mechanism.released_sums(float(self.within), float(self.base.totals.sum()) / self.rows_per_client)
        return active, (base + noised / count).to(self.dtype)
