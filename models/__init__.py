"""LightningModules and the papers' networks (installed as `fedlight.models`)."""

from fedlight.models.classifier import Classifier
from fedlight.models.cnn import FedAvgCNN, FedTSDPCNN, LeafCNN, OCFLCNN, SmallCNN
from fedlight.models.conv1d import Conv1DNet
from fedlight.models.lenet import LeNet5
from fedlight.models.mlp import MLP
from fedlight.models.resnet import ResNet9, ResNet18, ResNet34
from fedlight.models.centroids import CentroidModel
from fedlight.models.pretrained import LoRA, PretrainedClassifier
from fedlight.models.pretrained_lm import PretrainedCausalLM
