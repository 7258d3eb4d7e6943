"""Federated data modules and partition schemes (installed as `fedlight.datamodules`)."""
from fedlight.datamodules.base import ClientSplit, FederatedData, FederatedDataModule
from fedlight.datamodules.digits import DigitsFederated
from fedlight.datamodules.npz import NpzFederated
from fedlight.datamodules.partition import (IID, ClassesPerClient, Dirichlet, LabelPermutations, MissingClasses,
                                            Natural, PartitionScheme, QuantitySkew, Rotations, Shards)
