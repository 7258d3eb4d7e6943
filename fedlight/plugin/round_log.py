"""The logging service of algorithms: what a hook records as it acts (`Algorithm.log`, `Algorithm.log_matrix`),
collected for the round and taken by the engine when the round ends."""

from __future__ import annotations

import numpy as np
from torch import Tensor


class RoundLog:
    """Scalars and matrices recorded during one round, by name (a name recorded again keeps the later value).
    What is recorded in `setup` belongs to round 1."""

    def __init__(self) -> None:
        self.scalars: dict[str, float] = {}
        self.matrices: dict[str, np.ndarray] = {}

    def scalar(self, name: str, value: float | Tensor) -> None:
        """Record the scalar `value` under `name` (`Algorithm.log`)."""
        self.scalars[name] = float(value)

    def matrix(self, name: str, matrix: np.ndarray | Tensor) -> None:
        """Record `matrix` under `name`, as a NumPy array on the host (`Algorithm.log_matrix`)."""
        self.matrices[name] = matrix.detach().cpu().numpy() if isinstance(matrix, Tensor) else np.asarray(matrix)

    def take(self) -> tuple[dict[str, float], dict[str, np.ndarray]]:
        """(scalars, matrices) recorded since the last call, and a clean log for the next round."""
        taken = self.scalars, self.matrices
        self.scalars, self.matrices = {}, {}
        return taken
