"""Stand-ins for Lightning's base classes and fedlight's `Algorithm` in the command line's types, so that building the
parser (for `--help`, `list` and most config errors) does not import Lightning, torch or scikit-learn, which take
several seconds on a laptop CPU.

`issubclass(cls, LightningModule)` and `isinstance(obj, LightningModule)` import the real class the first time they
are asked and answer for it, which happens only when a config names a class (and so imports it anyway).
The stand-ins are abstract, so jsonargparse never offers them as a class to instantiate.
"""

from __future__ import annotations

import importlib
from abc import ABCMeta, abstractmethod
from typing import Any


class LazyBase(ABCMeta):
    """A metaclass whose classes stand for the class named by their `target` ("module:name")."""

    target: str

    def real(cls) -> type:
        """The class `target` names, imported."""
        module, _, name = cls.target.partition(":")
        return getattr(importlib.import_module(module), name)

    def __subclasscheck__(cls, subclass: type) -> bool:
        return issubclass(subclass, cls.real())

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, cls.real())


class LightningDataModule(metaclass=LazyBase):
    """A LightningDataModule that cuts a data set into clients (see `fedlight list` for the shipped ones)."""

    target = "lightning:LightningDataModule"

    @abstractmethod
    def setup(self, stage: str) -> None:
        """Lightning's `setup`, abstract here so that the stand-in is never instantiated."""
        ...


class LightningModule(metaclass=LazyBase):
    """A LightningModule the clients train with its own `training_step` and `configure_optimizers`."""

    target = "lightning:LightningModule"

    @abstractmethod
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """Lightning's `training_step`, abstract here so that the stand-in is never instantiated."""
        ...


class FederatedAlgorithm(metaclass=LazyBase):
    """A federated algorithm: `fedlight.plugin.Algorithm` or a subclass (see `fedlight list` for the shipped ones).
    Not named `Algorithm`: jsonargparse looks a class up by name in its package's parents, and `fedlight.Algorithm`
    would import the real one."""

    target = "fedlight.plugin.algorithm:Algorithm"

    @abstractmethod
    def aggregate(self, round: int, updates: Any) -> None:
        """`Algorithm.aggregate`, abstract here so that the stand-in is never instantiated."""
        ...
