"""Finding plugins: algorithms by entry point (group `fedlight.algorithms`) and by import path, data modules
and models among the installed fedlight packages (and their own entry-point groups)."""
from __future__ import annotations

import functools
import importlib
import inspect
import textwrap
from importlib.metadata import entry_points
from typing import Any

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
    raise ValueError(f"unknown algorithm {value!r}: choose one of {', '.join(sorted(names))}, or give an importable "
                     "class path such as mypackage.MyAlgorithm")


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
                raise ValueError(f"config key {key!r} sits beside {head!r} in the same mapping, which would replace "
                                 f"{head!r} rather than change it: nest it under {head!r}, or pass "
                                 f"--{key} on the command line")
        for value in document.values():
            check_dotted_keys(value)
    return document


def _classes_in_package(package: str, base: type) -> dict[str, str]:
    """The classes a user puts in a config, among what `package` exports (its `__all__`, or else its public
    names): concrete subclasses of `base`, not `base` itself, nor a private name: name -> dotted path.
    Building blocks its modules define without exporting (a ResNet block, a shared base) are left out."""
    pkg = importlib.import_module(package)
    names = getattr(pkg, "__all__", None) or [name for name in vars(pkg) if not name.startswith("_")]
    found: dict[str, str] = {}
    for name in names:
        obj = getattr(pkg, name, None)
        if (inspect.isclass(obj) and issubclass(obj, base) and obj is not base and not name.startswith("_")
                and not inspect.isabstract(obj)):
            found[name] = f"{obj.__module__}.{obj.__qualname__}"
    return dict(sorted(found.items()))


def components() -> dict[str, dict[str, str]]:
    """Everything `fedlight list` shows: algorithms, data modules, partition schemes, models (LightningModules),
    networks (torch modules to put in a model, e.g. `Classifier`'s `network`); plugins' entry points included."""
    import lightning as L
    from torch import nn

    from fedlight.datamodules.base import FederatedDataModule
    from fedlight.datamodules.partition import PartitionScheme

    def with_plugins(found: dict[str, str], group: str) -> dict[str, str]:
        return {**found, **{f"{name} (entry point)": path for name, path in short_names(group).items()}}

    lightning_modules = _classes_in_package(MODELS, L.LightningModule)
    networks = {k: v for k, v in _classes_in_package(MODELS, nn.Module).items() if k not in lightning_modules}
    return {
        "algorithms": short_names(ALGORITHMS),
        "data modules": with_plugins(_classes_in_package(DATAMODULES, FederatedDataModule), DATAMODULES),
        "partition schemes": _classes_in_package(DATAMODULES, PartitionScheme),
        "models": with_plugins(lightning_modules, MODELS),
        "networks": networks,
    }


def describe(path: str) -> str:
    """The first sentence of the docstring of the class at `path` (shortened to one line), '' without one, or
    why it cannot be imported."""
    module, _, name = path.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module), name)
    except Exception as error:  # a broken plugin must not stop the listing of the rest
        return f"(cannot import: {type(error).__name__}: {error})".splitlines()[0]
    doc = getattr(obj, "__doc__", None)  # its own docstring, not one inherited from its base
    if not isinstance(doc, str) or not doc.strip():
        return ""
    paragraph = " ".join(inspect.cleandoc(doc).split("\n\n", 1)[0].split())
    return _first_sentence(paragraph)


def _first_sentence(text: str, width: int = 100) -> str:
    """`text` up to its first full stop outside parentheses, cut at a word to `width` characters."""
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "." and depth <= 0 and (i + 1 == len(text) or text[i + 1] == " "):
            text = text[:i + 1]
            break
    return textwrap.shorten(text, width, placeholder=" ...")
