"""Finding plugins: algorithms by entry point (group `fedlight.algorithms`) and by import path, data modules
and models by their own entry-point groups (what `fedlight list` shows of them is `fedlight.run.catalog`'s)."""

from __future__ import annotations

import functools
from importlib.metadata import entry_points
from typing import Any

from fedlight.plugin.choices import did_you_mean

ALGORITHMS = "fedlight.algorithms"
DATAMODULES = "fedlight.datamodules"
MODELS = "fedlight.models"


@functools.lru_cache(maxsize=None)
def short_names(group: str = ALGORITHMS) -> dict[str, str]:
    """Entry-point name -> dotted class path, for every installed plugin of `group` (cached: the config loader
    asks once per value; `cli.main` clears the cache so that each invocation sees newly installed plugins)."""
    return {ep.name: ep.value.replace(":", ".") for ep in entry_points(group=group)}


def algorithm_path(value: str, names: dict[str, str] | None = None) -> str:
    """The class path of an algorithm given by short name or path; an unknown bare name is an error that lists
    the installed names. A dotted path or a config file path passes through for jsonargparse to resolve."""
    names = short_names() if names is None else names
    if value in names:
        return names[value]
    if "." in value or "/" in value:
        return value
    raise ValueError(
        f"unknown algorithm {value!r}{did_you_mean(value, names)}: choose one of "
        f"{', '.join(sorted(names))}, or give an importable class path such as mypackage.MyAlgorithm"
    )


def resolve_class_paths(value: Any, names: dict[str, str] | None = None) -> Any:
    """Replace every `class_path` (and a bare `algorithm: name`) that is an entry-point name by its full
    path, anywhere in a parsed config document; an unknown bare algorithm name is an error."""
    names = short_names() if names is None else names
    if isinstance(value, dict):
        out = {k: resolve_class_paths(v, names) for k, v in value.items()}
        if isinstance(out.get("class_path"), str):
            out["class_path"] = names.get(out["class_path"], out["class_path"])
        algorithm = out.get("algorithm")
        if isinstance(algorithm, str):
            out["algorithm"] = algorithm_path(algorithm, names)
        elif isinstance(algorithm, dict) and isinstance(algorithm.get("class_path"), str):
            algorithm["class_path"] = algorithm_path(algorithm["class_path"], names)
        return out
    if isinstance(value, list):
        return [resolve_class_paths(v, names) for v in value]
    return value


def check_dotted_keys(document: Any) -> Any:
    """Refuse `section.key: value` beside `section:` in the same YAML mapping: jsonargparse would replace the
    whole section (with the bare base class when `section` names a file) instead of merging the key."""
    if isinstance(document, dict):
        for key in document:
            head = key.split(".", 1)[0] if isinstance(key, str) and "." in key else None
            if head is not None and head in document:
                raise ValueError(
                    f"config key {key!r} sits beside {head!r} in the same mapping, which would replace "
                    f"{head!r} rather than change it: nest it under {head!r}, or pass "
                    f"--{key} on the command line"
                )
        for value in document.values():
            check_dotted_keys(value)
    return document
