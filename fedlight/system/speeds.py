"""Per-client draws of the system model, each client's from a stream of (seed, purpose, client) of its own, as the
engine's other streams (`fedlight.plugin.server.stream_seed`): a client's speed, zone or phase does not depend on
how many clients the federation has, and a resumed run draws the same."""

from __future__ import annotations

import numpy as np

from fedlight.plugin.server import stream_seed
from fedlight.system.config import SpeedDistribution


def client_generator(seed: int, purpose: str, client: int) -> np.random.Generator:
    """The generator of one client's draw for `purpose`."""
    return np.random.default_rng(stream_seed(seed, "system", purpose, client))


def client_uniforms(seed: int, purpose: str, count: int) -> np.ndarray:
    """(count,) one uniform draw in [0, 1) per client."""
    return np.array([client_generator(seed, purpose, c).random() for c in range(count)])


def client_normals(seed: int, purpose: str, count: int) -> np.ndarray:
    """(count,) one standard normal draw per client."""
    return np.array([client_generator(seed, purpose, c).standard_normal() for c in range(count)])


def smallest(values: np.ndarray, share: float) -> np.ndarray:
    """(len(values),) True on the `share` of the entries with the smallest values (the share of a count rounded to
    the nearest, ties by position)."""
    count = int(np.floor(round(share * len(values), 9) + 0.5))
    chosen = np.zeros(len(values), dtype=bool)
    chosen[np.argsort(values, kind="stable")[:count]] = True
    return chosen


def draw_speeds(distribution: SpeedDistribution, count: int, seed: int, purpose: str) -> np.ndarray:
    """(count,) every client's speed under `distribution`; `purpose` names the speed (compute, link), so the two
    speeds of a client are independent."""
    if distribution.kind == "lognormal":
        return distribution.median * np.exp(distribution.sigma * client_normals(seed, purpose, count))
    speeds = np.full(count, float(distribution.median))
    if distribution.kind == "slow_share":
        speeds[smallest(client_uniforms(seed, purpose, count), distribution.slow_share)] /= distribution.slow_factor
    return speeds
