"""The names under which a checkpoint keeps its callbacks' states: a callback's class and the arguments it was built
with, so that reordering the callbacks of a resumed run cannot hand one callback another's state.

`construction_key` renders a class and its constructor arguments as text that is the same in every process and on
every restart: plain values as written, containers and dataclasses field by field, and any other object (a console,
an Optuna trial) by its class alone, since its identity does not outlive the process. `state_keys` numbers the
second and later callbacks of one key in order ("...#2"). `v1_keys` are the names of checkpoint format 1 (the class
name, numbered per class), from which `fedlight.run.checkpoint` upgrades an old checkpoint.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import numbers
from pathlib import PurePath
from typing import Any


def class_path(cls: type) -> str:
    """`module.QualifiedName` of a class."""
    return f"{cls.__module__}.{cls.__qualname__}"


def construction_key(cls: type[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """`module.Class(name=value, ...)`: the class and its constructor's arguments by name, defaults filled in, so
    that a positional and a keyword call of the same arguments give one key."""
    arguments: dict[str, Any] = {}
    if cls.__init__ is not object.__init__:
        try:
            bound = inspect.signature(cls.__init__).bind(None, *args, **kwargs)  # None stands for `self`
            bound.apply_defaults()
            arguments = dict(list(bound.arguments.items())[1:])
        except (TypeError, ValueError):  # arguments `__init__` refuses (it raises itself), or no signature
            arguments = {**{str(i): a for i, a in enumerate(args)}, **kwargs}
    return f"{class_path(cls)}({', '.join(f'{name}={stable_repr(value)}' for name, value in arguments.items())})"


def stable_repr(value: Any) -> str:
    """`value` as text that does not depend on the process: no memory addresses, dictionaries in sorted order."""
    if isinstance(value, enum.Enum):
        return f"{class_path(type(value))}.{value.name}"
    if value is None or isinstance(value, (numbers.Number, str, bytes)):
        return repr(value)
    if isinstance(value, PurePath):
        return repr(value.as_posix())
    if isinstance(value, (list, tuple)):
        opening, closing = "[]" if isinstance(value, list) else "()"
        return opening + ", ".join(stable_repr(v) for v in value) + closing
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(sorted(stable_repr(v) for v in value)) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(sorted(f"{stable_repr(k)}: {stable_repr(v)}" for k, v in value.items())) + "}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ", ".join(f"{f.name}={stable_repr(getattr(value, f.name))}" for f in dataclasses.fields(value))
        return f"{class_path(type(value))}({fields})"
    return class_path(type(value))  # an object's identity does not survive a restart: only its kind counts


def state_key(callback: Any) -> str:
    """A callback's key: what `fedlight.Callback` recorded at its construction, or, for another object with the
    hooks, its class alone."""
    return getattr(callback, "_construction_key", None) or class_path(type(callback))


def state_keys(callbacks: list[Any]) -> list[str]:
    """A key per callback; the second and later callbacks of one key are numbered in order ("...#2")."""
    return _numbered([state_key(c) for c in callbacks])


def v1_keys(callbacks: list[Any]) -> list[str]:
    """The keys of checkpoint format 1: the class name, numbered from the second of a class on ("EarlyStopping#2")."""
    return _numbered([type(c).__name__ for c in callbacks])


def key_class(key: str) -> str:
    """The class path a key starts with."""
    return key.split("(", 1)[0].split("#", 1)[0]


def _numbered(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    keys = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        keys.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return keys
