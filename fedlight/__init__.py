"""fedlight: clustered and personalized federated learning on PyTorch Lightning."""
from fedlight.algorithm import Algorithm, Updates
from fedlight.federation import Federation, FederationConfig

__all__ = ["Algorithm", "Updates", "Federation", "FederationConfig"]
__version__ = "0.1.0"
