"""A tuning search space: a YAML file of dotted config keys and the distribution each is drawn from, read and
checked before any trial runs.

    base: ../quickstart.yaml          # the run config the space was written for (checked by the tests)
    fixed:                            # fit options every trial and the default runs take
      algorithm: fedprox
    params:                           # key -> distribution, drawn in this order
      algorithm.init_args.mu: {type: float, low: 0.001, high: 1.0, log: true}
      model.init_args.lr: {type: float, low: 0.005, high: 0.2, log: true}
      federation.local_epochs: {type: int, low: 1, high: 4}
      algorithm: {type: categorical, choices: [fedavg, fedprox]}
      algorithm.init_args.mu: {..., when: {algorithm: fedprox}}   # drawn only in the trials that chose fedprox

A distribution is an Optuna one (`FloatDistribution`, `IntDistribution`, `CategoricalDistribution`), so whatever
Optuna refuses (low above high, a log range reaching 0) is refused here, with the key and the fix in one line.
Keys are checked by the run parser itself (`check_keys`), every categorical combination with each active
parameter at both ends of its range, so an unknown key, an option the chosen class does not have, or a value of
the wrong type stops the command before the first trial.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedlight.run import registry

KINDS = ("float", "int", "categorical")
RANGE_FIELDS = {"type", "low", "high", "log", "step", "when"}
FIELDS = {"float": RANGE_FIELDS, "int": RANGE_FIELDS, "categorical": {"type", "choices", "when"}}
#: keys a space may not set: trials always evaluate on validation data, and each trial runs in one process
RESERVED = ("federation.eval_split", "output_dir", "run_name", "resume", "federation.devices", "federation.num_nodes")
#: the most categorical combinations checked against the parser
MAX_COMBINATIONS = 256


class SpaceError(ValueError):
    """A space file that cannot be searched; the message names the file, the key and the fix."""


@dataclass
class Param:
    """One searched key and its distribution; `when` makes it active only in trials whose earlier categorical
    parameters took the given values."""

    key: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: list[Any] = field(default_factory=list)
    when: dict[str, Any] = field(default_factory=dict)

    def bounds(self) -> tuple[float | int, float | int]:
        """(low, high) of an int or float parameter (`load` refuses one without them)."""
        assert self.low is not None and self.high is not None, f"{self.key} is not a range"
        return self.low, self.high

    def distribution(self) -> Any:
        """The Optuna distribution (which checks the range: low <= high, a positive low for log, ...)."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.kind == "categorical":
            return CategoricalDistribution(self.choices)
        low, high = self.bounds()
        if self.kind == "int":
            return IntDistribution(int(low), int(high), log=self.log, step=int(self.step or 1))
        return FloatDistribution(
            float(low), float(high), log=self.log, step=None if self.step is None else float(self.step)
        )

    def suggest(self, trial: Any) -> Any:
        """This parameter's value in `trial` (Optuna's define-by-run API)."""
        if self.kind == "categorical":
            return trial.suggest_categorical(self.key, self.choices)
        low, high = self.bounds()
        if self.kind == "int":
            return trial.suggest_int(self.key, int(low), int(high), log=self.log, step=int(self.step or 1))
        return trial.suggest_float(self.key, float(low), float(high), log=self.log, step=self.step)

    def ends(self) -> list[Any]:
        """The values the parser checks: both ends of a range, every choice."""
        return list(self.choices) if self.kind == "categorical" else [self.low, self.high]

    def active(self, values: dict[str, Any]) -> bool:
        """Whether the parameter is drawn in a trial with `values` so far: each key of `when` has its value there."""
        return all(values.get(k) == v for k, v in self.when.items())


@dataclass
class Space:
    """A parsed space file."""

    path: Path
    params: list[Param]
    fixed: dict[str, Any] = field(default_factory=dict)
    base: Path | None = None

    def suggest(self, trial: Any) -> dict[str, Any]:
        """The values of every active parameter in `trial`, in file order."""
        values: dict[str, Any] = {}
        for param in self.params:
            if param.active(values):
                values[param.key] = param.suggest(trial)
        return values

    def combinations(self) -> Iterator[dict[str, Any]]:
        """Every reachable assignment of the categorical parameters with the numeric ones at their lower ends,
        and the same with them at their upper ends: what `check_keys` parses."""
        choices = [p for p in self.params if p.kind == "categorical"]
        for picked in itertools.product(*(p.choices for p in choices)):
            chosen = dict(zip((p.key for p in choices), picked))
            for end in (0, 1):
                values: dict[str, Any] = {}
                for param in self.params:
                    if param.active(values):
                        values[param.key] = chosen[param.key] if param.kind == "categorical" else param.ends()[end]
                yield values


def _fail(path: Path, message: str) -> SpaceError:
    return SpaceError(f"{path}: {message}")


def _param(path: Path, key: Any, spec: Any, earlier: dict[str, Param]) -> Param:
    if not isinstance(key, str) or not key or key.startswith("-"):
        raise _fail(path, f"parameter {key!r}: a key is a dotted config key such as model.init_args.lr")
    if key.startswith(RESERVED) or key.endswith(".class_path") and key[: -len(".class_path")] in RESERVED:
        raise _fail(
            path,
            f"{key} cannot be searched: trials evaluate on validation data in one process each, in "
            "folders tune names; remove it from the space",
        )
    if not isinstance(spec, dict) or spec.get("type") not in KINDS:
        raise _fail(
            path,
            f"{key}: give a mapping with type float, int or categorical, e.g. {{type: float, low: "
            "0.001, high: 0.1, log: true}",
        )
    kind = spec["type"]
    unknown = sorted(set(spec) - FIELDS[kind])
    if unknown:
        raise _fail(
            path,
            f"{key}: a {kind} parameter has no field {unknown[0]!r}; its fields are {', '.join(sorted(FIELDS[kind]))}",
        )
    when = spec.get("when") or {}
    if not isinstance(when, dict):
        raise _fail(
            path, f"{key}: when is a mapping of earlier categorical parameters to values, e.g. {{algorithm: fedprox}}"
        )
    for other, value in when.items():
        if other not in earlier or earlier[other].kind != "categorical" or value not in earlier[other].choices:
            raise _fail(
                path,
                f"{key}: when {other}: {value!r} needs an earlier categorical parameter {other} with "
                f"{value!r} among its choices",
            )
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise _fail(path, f"{key}: a categorical parameter needs a non-empty list of choices")
        if not all(c is None or isinstance(c, (bool, int, float, str)) for c in choices):
            raise _fail(
                path,
                f"{key}: choices are numbers, strings, booleans or null (a class with options: choose "
                "its class_path and search its options as parameters with `when`)",
            )
        param = Param(key, kind, choices=list(choices), when=dict(when))
    else:
        missing = [name for name in ("low", "high") if name not in spec]
        if missing:
            raise _fail(path, f"{key}: a {kind} parameter needs low and high (no {missing[0]})")
        numbers = [spec[name] for name in ("low", "high", "step") if spec.get(name) is not None]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in numbers):
            given = [spec.get(n) for n in ("low", "high")]
            raise _fail(path, f"{key}: low, high and step must be numbers, got {given}")
        if kind == "int" and not all(isinstance(v, int) for v in numbers):
            raise _fail(path, f"{key}: an int parameter has whole-number low, high and step; use type: float")
        param = Param(
            key, kind, spec["low"], spec["high"], bool(spec.get("log", False)), spec.get("step"), when=dict(when)
        )
    try:
        param.distribution()
    except ValueError as error:
        raise _fail(path, f"{key}: invalid distribution ({' '.join(str(error).split())})") from None
    return param


def load(path: str | Path) -> Space:
    """The space file at `path`, every parameter checked for form and range (not yet against the parser)."""
    path = Path(path)
    if not path.is_file():
        raise SpaceError(f"--space {path}: no such file")
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise _fail(path, f"not valid YAML ({' '.join(str(error).split())})") from None
    if not isinstance(document, dict):
        raise _fail(path, "a space file is a mapping with params (and optionally fixed and base)")
    unknown = sorted(set(document) - {"base", "fixed", "params"})
    if unknown:
        raise _fail(path, f"unknown key {unknown[0]!r}; a space file has base, fixed and params")
    params = document.get("params")
    if not isinstance(params, dict) or not params:
        raise _fail(
            path,
            "no params: map dotted config keys to distributions, e.g. model.init_args.lr: {type: "
            "float, low: 0.001, high: 0.1, log: true}",
        )
    fixed = document.get("fixed") or {}
    if not isinstance(fixed, dict):
        raise _fail(path, "fixed is a mapping of dotted config keys to values")
    for key in fixed:
        if str(key).startswith(RESERVED):
            raise _fail(
                path, f"fixed {key}: tune sets it itself (trials on validation data, one process each); remove it"
            )
    earlier: dict[str, Param] = {}
    for key, spec in params.items():
        if key in fixed:
            raise _fail(path, f"{key} is both fixed and searched; keep one")
        earlier[key] = _param(path, key, spec, earlier)
    base = path.parent / document["base"] if document.get("base") else None
    space = Space(path, list(earlier.values()), dict(fixed), base)
    count = sum(1 for _ in space.combinations()) // 2
    if count > MAX_COMBINATIONS:
        raise _fail(
            path,
            f"{count} combinations of categorical choices; at most {MAX_COMBINATIONS} (search fewer "
            "categorical keys, or numeric ranges instead)",
        )
    return space


def arguments(values: dict[str, Any]) -> list[str]:
    """`fit` command-line options setting `values` (dotted keys): strings as given (an algorithm's short name
    resolved to its class path), anything else as JSON."""
    args = []
    for key, value in values.items():
        if isinstance(value, str) and key in ("algorithm", "algorithm.class_path"):
            value = registry.algorithm_path(value)
        args += [f"--{key}", value if isinstance(value, str) else json.dumps(value)]
    return args


def check_keys(space: Space, parse: Callable[[list[str]], Any], explain: Callable[[Exception], str]) -> None:
    """Parse the fixed options and every combination of the space with `parse` (the run parser over the base
    config); the first refusal becomes one line naming the space file, the key and what the parser said."""
    try:
        parse(arguments(space.fixed))
    except Exception as error:  # jsonargparse's ArgumentError, the config loader's ValueError
        raise _fail(space.path, f"fixed: {explain(error)}") from None
    for values in space.combinations():
        try:
            parse(arguments({**space.fixed, **values}))
        except Exception as error:
            context = ", ".join(f"{k}={v}" for k, v in values.items())
            raise _fail(
                space.path, f"{explain(error)} (with {context}; a key that only some choices have needs `when`)"
            ) from None
