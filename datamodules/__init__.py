"""Federated data modules and partition schemes (installed as `fedlight.datamodules`)."""

from fedlight.datamodules.base import ClientSplit, FederatedData, FederatedDataModule
from fedlight.datamodules.digits import DigitsFederated
from fedlight.datamodules.npz import NpzFederated
from fedlight.datamodules.partition import (
    IID,
    ClassesPerClient,
    Dirichlet,
    Groups,
    LabelPermutations,
    MissingClasses,
    Natural,
    PartitionScheme,
    QuantitySkew,
    Rotations,
    Shards,
)
from fedlight.datamodules.femnist import FEMNISTFederated
from fedlight.datamodules.medmnist import MedMNISTFederated
from fedlight.datamodules.uci import AdultFederated, BankMarketingFederated, DiabetesFederated, UCITableFederated
from fedlight.datamodules.vision import (
    CIFAR10Federated,
    CIFAR100Federated,
    EMNISTFederated,
    FashionMNISTFederated,
    MNISTFederated,
    SVHNFederated,
    TorchvisionFederated,
)
from fedlight.datamodules.wisdm import WISDMFederated
from fedlight.datamodules.synthetic import SyntheticGaussians
from fedlight.datamodules.synthetic_mixture import SyntheticMixture
from fedlight.datamodules.heterogeneity import Heterogeneity
from fedlight.datamodules.concept_shift import ConceptShift
from fedlight.datamodules.text import TextFederated
from fedlight.datamodules.instructions import InstructionFederated
