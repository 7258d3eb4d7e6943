"""The run config's sections this package acts on, as plain dataclasses the command line reads without loading torch:
`aggregator:` (`AggregatorConfig`, how the members' updates of each cluster are combined, and the rules' table; the
rules themselves are `fedlight.aggregators.robust`'s), `attack:` (`AttackConfig`), `privacy:` (`PrivacyConfig`) and
`server_optimizer:` (`ServerOptimizerConfig`). Each is re-exported by the module that acts on it."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from fedlight.plugin.choices import unknown_choice


def one_member(attackers: int) -> int:
    """The fewest clients a cluster needs under a rule with no minimum: one, whatever the attackers."""
    return 1


@dataclass(frozen=True)
class Rule:
    """An aggregation rule as the engine runs it.

    Attributes:
        name: the value of `aggregator.rule`.
        holds: it needs every update of a cluster at once (the plan then holds the round's updates); False: it is a
            sum over clients, streamed a group at a time.
        min_members: the fewest clients a cluster needs for the rule's guarantee with f attackers (f -> count).
        tolerated: how many attackers among m updates the rule is built to withstand, from its settings ((settings,
            m) -> count; None: no claim, the mean's, or a norm clip's, which bounds each update's weight without
            excluding any).
    """

    name: str
    holds: bool
    min_members: Callable[[int], int] = one_member
    tolerated: Callable[["AggregatorConfig", int], int] | None = None


def _minority(settings: "AggregatorConfig", m: int) -> int:
    """A median's breakdown point: fewer than half of the updates."""
    return (m - 1) // 2


RULES = {
    rule.name: rule
    for rule in (
        Rule("mean", holds=False),  # no robustness claimed: an attack on FedAvg's mean is an experiment, not a mistake
        Rule("median", holds=True, tolerated=_minority),
        Rule("trimmed_mean", holds=True, tolerated=lambda settings, m: math.floor(settings.beta * m)),
        Rule("krum", holds=True, min_members=lambda f: 2 * f + 3, tolerated=lambda settings, m: settings.f),
        Rule("multikrum", holds=True, min_members=lambda f: 2 * f + 3, tolerated=lambda settings, m: settings.f),
        Rule("bulyan", holds=True, min_members=lambda f: 4 * f + 3, tolerated=lambda settings, m: settings.f),
        Rule("geomed", holds=True, tolerated=_minority),
        Rule("clipped_mean", holds=False),
    )
}


def attackers_beyond_rule(settings: "AggregatorConfig", fraction: float, cohort: int) -> str | None:
    """The warning line when a round's expected attackers (`fraction` of `cohort` updates) outnumber what the rule
    is set to withstand (None when they do not, or the rule gives no count): the rule's guarantee then does not hold,
    so a run that shows it failing shows its settings, not the rule."""
    rule = RULES[settings.rule]
    rows = settings.buckets(cohort)  # each attacker can spoil one bucket
    attackers = min(round(fraction * cohort), rows)
    tolerated = None if rule.tolerated is None else rule.tolerated(settings, rows)
    if tolerated is None or attackers <= tolerated:
        return None
    fix = {
        "trimmed_mean": f"aggregator.beta at least {attackers / rows:g}",
        "krum": f"aggregator.f {attackers}",
        "multikrum": f"aggregator.f {attackers}",
        "bulyan": f"aggregator.f {attackers}",
    }.get(settings.rule, "a robust aggregator.rule")
    return (
        f"about {attackers} of the {rows} {'updates' if rows == cohort else 'buckets'} a round are an attacker's "
        f"(attack.fraction {fraction:g}), more than aggregator.rule {settings.rule} withstands as set "
        f"({tolerated}): its guarantee does not hold; set {fix} to test the rule itself"
    )


@dataclass(frozen=True)
class AggregatorConfig:
    """How the members' updates of each cluster are combined, for every algorithm that aggregates through the
    engine's cluster aggregator.

    Attributes:
        rule: "mean" (weighted, FedAvg's), "median" (coordinate-wise), "trimmed_mean" (`beta`), "krum" and
            "multikrum" (`f`, `keep`), "bulyan" (`f`), "geomed" (the geometric median, RFA's Weiszfeld iterations),
            "clipped_mean" (each update clipped to norm `clip`). All but the mean and the clipped mean hold every
            update of a round.
        f: attackers Krum, Multi-Krum and Bulyan tolerate per cluster (they need 2f+3, 2f+3 and 4f+3 clients a round).
        beta: share of values trimmed at each end of every coordinate by "trimmed_mean", in [0, 0.5).
        clip: norm each update is clipped to by "clipped_mean".
        keep: updates Multi-Krum averages (None: the clients of the cluster minus f).
        bucket: s of bucketing ("Byzantine-Robust Learning on Heterogeneous Datasets via Bucketing", Karimireddy,
            He, Jaggi, ICLR 2022, Algorithm 1): a held rule is applied to the means of random buckets of s updates
            (drawn afresh each round), which brings heterogeneous clients' updates closer together, so the rule
            discards less honest work; f and beta then count buckets. 1: off.
    """

    rule: str = "mean"
    f: int = 1
    beta: float = 0.1
    clip: float = 1.0
    keep: int | None = None
    bucket: int = 1

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise unknown_choice("aggregator.rule", self.rule, RULES)
        if self.f < 0:
            raise ValueError(f"aggregator.f must be 0 or more, got {self.f}")
        if not 0 <= self.beta < 0.5:
            raise ValueError(f"aggregator.beta must be in [0, 0.5), got {self.beta}")
        if self.clip <= 0:
            raise ValueError(f"aggregator.clip must be above 0, got {self.clip}")
        if self.keep is not None and self.keep < 1:
            raise ValueError(f"aggregator.keep must be at least 1 or None, got {self.keep}")
        if self.bucket < 1:
            raise ValueError(f"aggregator.bucket must be at least 1, got {self.bucket}")
        if self.bucket > 1 and not self.holds:
            raise ValueError(
                f"aggregator.bucket {self.bucket} needs a rule that holds the round's updates (median, "
                f"trimmed_mean, krum, multikrum, bulyan, geomed); {self.rule} would not change: set bucket 1"
            )

    def buckets(self, updates: int) -> int:
        """How many updates the rule sees when `updates` are bucketed: ceil(updates / bucket)."""
        return -(-updates // self.bucket)

    @property
    def holds(self) -> bool:
        """Whether the rule needs every update of a round at once."""
        return RULES[self.rule].holds


DATA_ATTACKS = ("label_flip", "backdoor")
UPDATE_ATTACKS = ("sign_flip", "scale", "gaussian")
DEFAULT_SCALE = {"sign_flip": 10.0, "scale": 10.0, "gaussian": 1.0}


@dataclass
class AttackConfig:
    """Malicious clients (the `attack:` section; no `kind`: no attack).

    Args:
        kind: "label_flip", "backdoor", "sign_flip", "scale" or "gaussian" (None: every client is honest).
        fraction: share of the clients that are malicious, in (0, 1); the same clients every round.
        scale: s of the update attacks: `sign_flip` sends start - s * update (default 10), `scale` start + s * update
            (default 10), `gaussian` start + N(0, s^2) in every entry (default 1).
        target: the label a backdoor's trigger leads to.
        poison_fraction: share of a backdoor attacker's training rows that carry the trigger, in (0, 1].
        trigger_size: the trigger: a square of this side at the bottom-right of each sample's last two dimensions
            (images), or its last this-many features (tables), set to the training split's largest value.
    """

    kind: str | None = None
    fraction: float = 0.2
    scale: float | None = None
    target: int = 0
    poison_fraction: float = 0.5
    trigger_size: int = 3

    def __post_init__(self) -> None:
        kinds = DATA_ATTACKS + UPDATE_ATTACKS
        if self.kind is not None and self.kind not in kinds:
            raise unknown_choice("attack.kind", self.kind, kinds, " (or left out)")
        if not 0 < self.fraction < 1:
            raise ValueError(
                f"attack.fraction must be in (0, 1) (a share of the clients, some honest), got {self.fraction}"
            )
        if self.scale is not None and self.scale <= 0:
            raise ValueError(f"attack.scale must be above 0, got {self.scale}")
        if not 0 < self.poison_fraction <= 1 or self.trigger_size < 1:
            raise ValueError(
                f"attack.poison_fraction must be in (0, 1] and attack.trigger_size at least 1, got "
                f"{self.poison_fraction} and {self.trigger_size}"
            )

    @property
    def active(self) -> bool:
        """Whether an attack is configured (`kind` is set)."""
        return self.kind is not None


ACCOUNTANTS = ("rdp", "prv")


@dataclass
class PrivacyConfig:
    """Client-level DP (the `privacy:` section; leave it out for none).

    Args:
        noise_multiplier: z, the noise's standard deviation over the clip. None: chosen from `target_epsilon` for the
            configured rounds.
        clip: C, the norm every update is clipped to (the initial clip with `adaptive`). Required.
        delta: the delta `privacy/epsilon` is reported for.
        target_epsilon: with no `noise_multiplier`, the epsilon z is chosen to reach after `federation.rounds`;
            with one, the run stops after the last round whose epsilon stays within it.
        accountant: "rdp" or "prv" (Opacus's accountants).
        adaptive: follow the `target_quantile` of the update norms (Andrew et al.) instead of a fixed clip.
        target_quantile: gamma, the share of updates meant to be within the clip.
        clip_learning_rate: eta, the step of the clip's geometric update.
        count_noise: sigma_b, the noise on the count of unclipped updates (None: clients per round / 20).
    """

    noise_multiplier: float | None = None
    clip: float | None = None
    delta: float = 1e-5
    target_epsilon: float | None = None
    accountant: str = "rdp"
    adaptive: bool = False
    target_quantile: float = 0.5
    clip_learning_rate: float = 0.2
    count_noise: float | None = None

    def __post_init__(self) -> None:
        if self.clip is None or self.clip <= 0:
            raise ValueError(
                f"privacy.clip must be given, above 0 (the norm each update is clipped to: DP needs a "
                f"bound on a client's contribution), got {self.clip}"
            )
        if self.noise_multiplier is None and self.target_epsilon is None:
            raise ValueError(
                "privacy needs privacy.noise_multiplier or privacy.target_epsilon (or leave the privacy section out)"
            )
        if self.noise_multiplier is not None and self.noise_multiplier <= 0:
            raise ValueError(f"privacy.noise_multiplier must be above 0, got {self.noise_multiplier}")
        if self.target_epsilon is not None and self.target_epsilon <= 0:
            raise ValueError(f"privacy.target_epsilon must be above 0, got {self.target_epsilon}")
        if not 0 < self.delta < 1:
            raise ValueError(f"privacy.delta must be in (0, 1), got {self.delta}")
        if self.accountant not in ACCOUNTANTS:
            raise ValueError(f"privacy.accountant must be 'rdp' or 'prv', got {self.accountant!r}")
        if not 0 < self.target_quantile < 1 or self.clip_learning_rate <= 0:
            raise ValueError(
                f"privacy.target_quantile must be in (0, 1) and privacy.clip_learning_rate above 0, got "
                f"{self.target_quantile} and {self.clip_learning_rate}"
            )
        if self.count_noise is not None and self.count_noise <= 0:
            raise ValueError(f"privacy.count_noise must be above 0, got {self.count_noise}")


KINDS = ("sgd", "momentum", "adam", "yogi", "adagrad")
DEFAULT_LR = {"sgd": 1.0, "momentum": 1.0, "adam": 0.01, "yogi": 0.01, "adagrad": 0.1}


@dataclass(frozen=True)
class ServerOptimizerConfig:
    """The `server_optimizer:` section.

    Attributes:
        kind: "sgd", "momentum" (FedAvgM), "adam" (FedAdam), "yogi" (FedYogi) or "adagrad" (FedAdagrad).
        lr: the server learning rate eta (None: the kind's default, see the module docstring).
        momentum: FedAvgM's beta.
        beta1, beta2: the adaptive kinds' moment decays.
        tau: the adaptive kinds' degree of adaptivity (added to sqrt(v); v starts at tau^2).
    """

    kind: str = "adam"
    lr: float | None = None
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise unknown_choice("server_optimizer.kind", self.kind, KINDS)
        if self.lr is not None and not self.lr > 0:
            raise ValueError(
                f"server_optimizer.lr must be above 0 (or null: {DEFAULT_LR[self.kind]} for {self.kind}), got {self.lr}"
            )
        for name in ("momentum", "beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"server_optimizer.{name} must be in [0, 1), got {getattr(self, name)}")
        if not self.tau > 0:
            raise ValueError(f"server_optimizer.tau must be above 0, got {self.tau}")

    @property
    def server_lr(self) -> float:
        """The server learning rate the run uses: `lr`, or the kind's default (`DEFAULT_LR`) when it is None."""
        return DEFAULT_LR[self.kind] if self.lr is None else self.lr

    def describe(self) -> str:
        """The start line's note: the kind and the learning rate used."""
        return f"server optimizer {self.kind} (lr {self.server_lr:g})"
