"""The engine's cluster aggregator: how the members' updates of each cluster become the cluster's model.

`Algorithm.aggregate` and `Algorithm.cluster_means` ask the server for one (`ServerContext.aggregation.new`) and
feed it rows a group at a time, as they fed `ClusterAverage` before; which one they get is the run's configuration,
never the algorithm's choice:

- `aggregator.rule: mean` with no privacy: `ClusterAverage`, the running float64 weighted sums (the numbers
  of a run without this feature, bit for bit);
- another rule (`fedlight.aggregators.robust`): `RobustClusterAggregate`, the rule applied within each cluster to the
  members' updates (trained minus start), added back to the cluster's start;
- `privacy:` on: `fedlight.aggregators.privacy.PrivateClusterAggregate`, DP-FedAvg's clipped and noised sums (the
  privacy extension puts its mechanism in, and keeps its accounting: `PrivacyMechanism.aggregation`).

A rule that needs every update of a cluster (the median, Krum, ...) makes the plan hold the round's updates
(`ExecutionPlan.hold_reason`); the sums of the mean, the clipped mean and DP stream a group at a time.

Every aggregator handed out records the entries it combined (`CountedAggregator`), so a run that configures a rule or
DP for an algorithm that combined its updates, or part of each model, some other way (Local keeps them, SCAFFOLD sums
them itself, pFedHN averages only the buffers and steps its hypernetwork from the raw changes) is stopped after round
1 in one line (`ClusterAggregation.check_applied`) instead of running with the setting silently ignored or applied to
part of the model only. Nothing is declared: it is what the round did.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

from fedlight.aggregators.config import AggregatorConfig
from fedlight.aggregators.config import RULES
from fedlight.aggregators.robust import apply_rule, bucket_means, clip_rows
from fedlight.plugin.aggregation import ClusterAverage

if TYPE_CHECKING:
    from fedlight.plugin.round_updates import RoundUpdates


class NoisedAggregation(Protocol):
    """What the cluster aggregation asks of a privacy mechanism (`fedlight.aggregators.privacy.PrivacyMechanism`):
    a fresh noised aggregator per call."""

    def aggregator(
        self,
        clusters: int,
        dim: int,
        dtype: torch.dtype,
        device: torch.device,
        personal_mask: Tensor | None,
        rows_per_client: int = 1,
    ) -> Any:
        """A fresh noised aggregator over `clusters` cluster rows of `dim` entries, with the `add`, `reduce` and `means`
        of the others (the arguments are `ClusterAggregation.new`'s)."""
        ...


def member_updates(values: Tensor, starts: Tensor | None, personal_mask: Tensor | None) -> Tensor:
    """Each row's update: trained minus start (the values themselves when no starts are given, e.g. deltas), with
    the personal entries zeroed: they are not aggregated, so they must not count in norms and distances."""
    updates = values if starts is None else values - starts
    return updates if personal_mask is None else updates.masked_fill(personal_mask, 0)


def add_starts(base: ClusterAverage, clusters: Tensor, starts: Tensor | None) -> None:
    """Count each row once in its cluster's mean start (`base`); without starts the rows are updates already, so the
    base stays 0 and only the members are counted."""
    ones = torch.ones(len(clusters), dtype=torch.float64, device=clusters.device)
    if starts is not None:
        base.add(clusters, ones, starts)
    else:
        base.totals.index_add_(0, clusters, ones)


class RobustClusterAggregate:
    """A robust rule within each cluster: rows are kept (held rules) or summed clipped (`clipped_mean`), and the
    result is the members' mean start plus the rule's combination of their updates. The starts of a cluster's
    members agree on the shared entries (the cluster model), so this is the rule applied to the models, shifted."""

    reads_starts = True  # the rule is applied to the updates, trained minus start

    def __init__(
        self,
        settings: AggregatorConfig,
        clusters: int,
        dim: int,
        dtype: torch.dtype,
        device: torch.device,
        personal_mask: Tensor | None = None,
        round: int = 0,
    ) -> None:
        self.settings, self.dtype, self.personal_mask = settings, dtype, personal_mask
        self.round = round  # seeds the buckets (`aggregator.bucket`): the same on a resumed run
        self.base = ClusterAverage(clusters, dim, dtype, device)  # mean start of each cluster's members
        self.clipped = ClusterAverage(clusters, dim, dtype, device)  # clipped_mean: its running sums
        self.rows: list[tuple[Tensor, Tensor, Tensor]] = []  # held rules: (clusters, weights, updates)

    def add(self, clusters: Tensor, weights: Tensor, values: Tensor, starts: Tensor | None = None) -> None:
        """Rows `values` of clusters `clusters` with weights `weights`, trained from `starts` (None: the values are
        updates already). Rows of weight 0 (a client without samples) are left out, as the mean leaves them out."""
        keep = weights > 0
        clusters, weights, values = clusters[keep], weights[keep], values[keep]
        starts = None if starts is None else starts[keep]
        updates = member_updates(values, starts, self.personal_mask)
        add_starts(self.base, clusters, starts)
        if self.settings.rule == "clipped_mean":
            self.clipped.add(clusters, weights, clip_rows(updates, self.settings.clip))
        else:
            self.rows.append((clusters, weights, updates))

    def reduce(self, updates: "RoundUpdates") -> None:
        """Streamed (`clipped_mean`): add the sums over the processes; held rules see every row on every process."""
        updates.sum_over_processes_(self.base.sums, self.base.totals, self.clipped.sums, self.clipped.totals)

    def means(self) -> tuple[Tensor, Tensor]:
        """(clusters with a member, their new models) in the rows' dtype."""
        active = (self.base.totals > 0).nonzero().flatten()
        base = self.base.sums[active] / self.base.totals[active, None]
        if self.settings.rule == "clipped_mean":
            combined = self.clipped.sums[active] / self.clipped.totals[active, None]
            return active, (base + combined).to(self.dtype)
        clusters = torch.cat([c for c, _, _ in self.rows])
        weights = torch.cat([w for _, w, _ in self.rows])
        updates = torch.cat([u for _, _, u in self.rows])
        s = self.settings
        combined = torch.stack(
            [
                apply_rule(
                    s.rule,
                    *self.bucketed(updates[clusters == k], weights[clusters == k], k),
                    s.f,
                    s.beta,
                    s.clip,
                    s.keep,
                ).double()
                for k in active.tolist()
            ]
        )
        return active, (base + combined).to(self.dtype)

    def bucketed(self, updates: Tensor, weights: Tensor, cluster: int) -> tuple[Tensor, Tensor]:
        """A cluster's rows as the rule sees them: the means of random buckets of `aggregator.bucket` rows (a stream
        seeded by the round and the cluster), or the rows themselves when bucketing is off."""
        if self.settings.bucket <= 1:
            return updates, weights
        generator = torch.Generator().manual_seed(self.round * 1_000_003 + cluster)
        return bucket_means(updates, weights, self.settings.bucket, generator)


class CountedAggregator:
    """An aggregator as `ClusterAggregation` hands it out: the same `add`, `reduce` and `means`; each `means` records
    in the round's `combined` how many entries of a client's model it combined (its rows' entries less the personal
    ones), the evidence that the configured rule or DP made the cluster models."""

    def __init__(self, inner: Any, owner: "ClusterAggregation", entries: int) -> None:
        self.inner, self.owner, self.entries = inner, owner, entries

    @property
    def reads_starts(self) -> bool:
        """Whether `add` needs the rows' starts (False for the plain mean: a caller may then pass None instead of
        building them); an aggregator that does not say is taken to read them."""
        return getattr(self.inner, "reads_starts", True)

    def add(self, clusters: Tensor, weights: Tensor, values: Any, starts: Tensor | None = None) -> None:
        """The inner aggregator's `add`: rows `values` of clusters `clusters` with weights `weights`, trained from
        `starts`."""
        self.inner.add(clusters, weights, values, starts)

    def reduce(self, updates: "RoundUpdates") -> None:
        """The inner aggregator's `reduce`: its sums added over the processes."""
        self.inner.reduce(updates)

    def means(self) -> tuple[Tensor, Tensor]:
        """The inner aggregator's (clusters with a member, their new models), after recording this aggregator's entries
        in the owner's `combined`."""
        self.owner.combined = max(self.owner.combined, self.entries)
        return self.inner.means()


class ClusterAggregation:
    """The run's choice of cluster aggregator (engine-owned; one per federation), handing a fresh aggregator to each
    call of `ServerContext.aggregation.new` and counting the means taken from them each round."""

    def __init__(self, settings: AggregatorConfig, privacy: NoisedAggregation | None = None) -> None:
        self.settings, self.privacy = settings, privacy
        self.server_optimizer: Any = None  # the `server_optimizer:` section's extension puts itself here
        self.combined = 0  # the most entries of a model an aggregator handed out this round took a mean over
        self.round = 0  # the round under way (`begin_round`), which seeds a robust rule's buckets

    @property
    def default(self) -> bool:
        """The plain weighted mean (FedAvg's numbers)."""
        return self.settings.rule == "mean" and self.privacy is None and self.server_optimizer is None

    def hold_reason(self) -> str | None:
        """Why the plan must hold every update of a round (None: the aggregator streams)."""
        if self.settings.holds:
            return f"aggregator.rule {self.settings.rule} needs every update of a cluster"
        return None

    def configured(self) -> str:
        """The settings that make this aggregation other than the default, as a config names them."""
        parts = [] if self.settings.rule == "mean" else [f"aggregator.rule: {self.settings.rule}"]
        parts += [] if self.privacy is None else ["the privacy section"]
        return " and ".join(parts + ([] if self.server_optimizer is None else ["the server_optimizer section"]))

    def describe(self) -> str:
        """The start line's note of a robust rule ('' for the mean; DP describes itself as an extension)."""
        return "" if self.settings.rule == "mean" else f"aggregator {self.settings.rule}"

    def begin_round(self, round: int) -> None:
        """Reset `combined`: `check_applied` reads what the round's aggregators combined."""
        self.combined, self.round = 0, round

    def new(
        self,
        clusters: int,
        dim: int,
        dtype: torch.dtype,
        device: torch.device,
        personal_mask: Tensor | None = None,
        rows_per_client: int = 1,
    ) -> CountedAggregator:
        """A fresh aggregator over `clusters` cluster rows of `dim` entries, to which every client adds
        `rows_per_client` rows (each in another cluster: FedEM's copy of each component)."""
        if self.privacy is not None:
            inner: Any = self.privacy.aggregator(clusters, dim, dtype, device, personal_mask, rows_per_client)
        elif self.settings.rule == "mean":
            inner = ClusterAverage(clusters, dim, dtype, device)
        else:
            inner = RobustClusterAggregate(self.settings, clusters, dim, dtype, device, personal_mask, self.round)
        if self.server_optimizer is not None:  # the combined rows stepped by the server optimizer
            inner = self.server_optimizer.wrap(inner, clusters, dim, dtype, device, personal_mask)
        personal = 0 if personal_mask is None else int(personal_mask.sum())
        return CountedAggregator(inner, self, dim - personal)

    def check_applied(self, algorithm: Any, num_params: int) -> None:
        """After round 1: refuse a run whose configured rule or DP no aggregator of the round applied to the shared
        entries of the model (the `num_params` less the algorithm's `personal_mask`): the algorithm combined its
        updates, or part of them, its own way, so the setting would have had no effect, or one on part of the model."""
        mask = algorithm.personal_mask
        shared = num_params - (0 if mask is None else int(mask.sum()))
        if self.default or self.combined >= shared:
            return
        name = type(algorithm).__name__
        what = (
            "its clients' updates"
            if not self.combined
            else f"{shared - self.combined:,} of the {shared:,} shared entries of its clients' models"
        )
        raise ValueError(
            f"{name} combined {what} in round 1 without the engine's cluster aggregator, so "
            f"{self.configured()} could not apply: run {name} with aggregator.rule: mean and no "
            "privacy or server_optimizer section (a plugin combines its updates through cluster_means or "
            "server.aggregation.new)"
        )


def largest_f(rule: str, members: int) -> int:
    """The most attackers `rule` tolerates among `members` clients (-1: too few clients even for none)."""
    f = 0
    while RULES[rule].min_members(f + 1) <= members:
        f += 1
    return f if RULES[rule].min_members(0) <= members else -1


def check_aggregation(aggregation: ClusterAggregation, algorithm: Any, per_round: int) -> None:
    """Refuse, before anything runs, DP beside a robust rule, and an f too large for the `per_round` clients of a
    round (a cluster never has more members than that)."""
    settings = aggregation.settings
    if aggregation.privacy is not None and settings.rule != "mean":
        raise ValueError(
            f"privacy noises the clipped sum of the updates (DP-FedAvg), so it needs aggregator.rule "
            f"mean, got {settings.rule}: drop one of the two"
        )
    rows = settings.buckets(per_round)  # what the rule sees: the round's updates, or their buckets
    need = RULES[settings.rule].min_members(settings.f)
    if need > rows:
        most = largest_f(settings.rule, rows)
        fix = f"lower aggregator.f to {most}" if most >= 0 else "use more clients a round or another aggregator.rule"
        seen = f"{per_round} clients a round" + (f" in {rows} buckets" if rows != per_round else "")
        raise ValueError(
            f"aggregator.f {settings.f} is too large for {settings.rule} with {seen} (it needs {need}): {fix}"
        )
