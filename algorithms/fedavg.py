"""FedAvg (McMahan et al., 2017): sample clients, train locally, average weighted by data size."""

from fedlight.plugin import Algorithm


class FedAvg(Algorithm):
    """The base class's behaviour, under its own name."""
