"""Confidence intervals over seeds: a method's mean with its Student-t interval, and the paired difference of two
methods run on the same seeds (the same clients' data and initial model for both, so the per-seed differences cancel
what the seed alone decides and the interval is tighter than two separate ones). Over clients, within one run: the
mean over clients with a percentile bootstrap interval (the clients resampled), which says how much the mean rests on
which clients happened to be in the federation."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Interval:
    """A mean over `n` runs and its two-sided interval at the level it was made for (NaN bounds for one run)."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        """Half the interval's width: the h of 'mean ± h' (NaN for one run)."""
        return (self.high - self.low) / 2

    def text(self, digits: int = 3) -> str:
        """'mean ± half-width' (the mean alone for one run)."""
        if self.n < 2:
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} ± {self.half_width:.{digits}f}"

    def excludes_zero(self) -> bool:
        """Whether the interval lies wholly on one side of 0 (a difference the seeds resolve)."""
        return self.n >= 2 and (self.low > 0 or self.high < 0)


def mean_interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """The mean of `values` and its Student-t interval: mean ± t_{(1+level)/2, n-1} s / sqrt(n), s the sample
    standard deviation (n - 1 in the denominator)."""
    x = np.asarray(values, dtype=float)
    if not len(x):
        raise ValueError("an interval needs at least one value")
    if not 0 < level < 1:
        raise ValueError(f"the interval's level must be in (0, 1), got {level}")
    mean = float(x.mean())
    if len(x) < 2:
        return Interval(mean, math.nan, math.nan, 1)
    half = float(stats.t.ppf((1 + level) / 2, len(x) - 1)) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return Interval(mean, mean - half, mean + half, len(x))


def paired_difference(a: Mapping[int, float], b: Mapping[int, float], level: float = 0.95) -> Interval:
    """The mean of a[seed] - b[seed] over the seeds both have, with its Student-t interval."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ValueError("the two methods share no seed: a paired difference needs runs of the same seeds")
    return mean_interval([a[s] - b[s] for s in seeds], level)


#: resamples of a client bootstrap, and its stream's seed (one interval for one run's values, whatever ran before)
BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED = 2000, 0


def client_bootstrap(values: Sequence[float], level: float = 0.95) -> Interval:
    """The mean of the clients' `values` (NaN ones left out: clients with nothing to evaluate) and its percentile
    bootstrap interval, the clients resampled with replacement (scipy.stats.bootstrap, a fixed seed)."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if not len(x):
        raise ValueError("an interval needs at least one value")
    mean = float(x.mean())
    if len(x) < 2 or float(x.min()) == float(x.max()):  # one client, or all alike: no spread to resample
        return Interval(mean, mean if len(x) > 1 else math.nan, mean if len(x) > 1 else math.nan, len(x))
    result = stats.bootstrap(
        (x,),
        np.mean,
        confidence_level=level,
        n_resamples=BOOTSTRAP_RESAMPLES,
        method="percentile",
        random_state=np.random.default_rng(BOOTSTRAP_SEED),
    )
    low, high = result.confidence_interval
    return Interval(mean, float(low), float(high), len(x))
