"""`system.selection`'s names and the selector each builds (`fedlight.system.selection`)."""

from __future__ import annotations

from fedlight.system.cluster_stratified import ClusterStratified
from fedlight.system.config import SystemConfig
from fedlight.system.oort import Oort
from fedlight.system.power_of_choice import PowerOfChoice
from fedlight.system.selection import ClientSelector, DataSize, SelectionContext, Uniform


def make_selector(config: SystemConfig, context: SelectionContext) -> ClientSelector:
    """The selector `config.selection` names, with its settings."""
    kind = config.selection
    if kind == "data_size":
        return DataSize(context)
    if kind == "power_of_choice":
        return PowerOfChoice(context, config.candidates)
    if kind == "oort":
        return Oort(context, config.candidates, config.oort_alpha, config.preferred_round_s or config.deadline_s)
    if kind == "cluster_stratified":
        return ClusterStratified(context)
    return Uniform(context)
