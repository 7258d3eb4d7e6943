"""What `fedlight list` shows, read from the source files without importing them.

Importing the data modules and models means importing Lightning (3-4 s on a laptop CPU) just to print their names.
The classes a config can name are instead found in the packages' `__init__.py` re-exports and their modules' class
definitions: a class counts as a data module, partition scheme, model (LightningModule) or network (torch module)
by following its bases through the package's own modules to one of the roots below, and it is left out when it is
abstract (an abstract method of a base it does not define). Descriptions are the first sentence of each class's own
docstring. Plugins are found by their entry points, their files by the import system's finders, without running
any module.
"""

from __future__ import annotations

import ast
import functools
import importlib.machinery
import inspect
import sys
import textwrap
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedlight.run.registry import ALGORITHMS, DATAMODULES, MODELS, short_names

LIGHTNING_MODULE = {
    "lightning.LightningModule",
    "lightning.pytorch.LightningModule",
    "lightning.pytorch.core.module.LightningModule",
    "pytorch_lightning.LightningModule",
}
TORCH_MODULE = {"torch.nn.Module", "torch.nn.modules.module.Module"}
DATA_MODULE = {"fedlight.datamodules.base.FederatedDataModule"}
PARTITION_SCHEME = {"fedlight.datamodules.partition.PartitionScheme"}


@dataclass
class ClassInfo:
    """One class definition as read from its source: where it is, its bases as dotted paths, its docstring and the
    methods it defines (abstract ones apart)."""

    path: str
    bases: list[str]
    doc: str | None
    defined: set[str] = field(default_factory=set)
    abstract: set[str] = field(default_factory=set)


@functools.lru_cache(maxsize=None)
def module_file(module: str) -> Path | None:
    """The source file of `module` (its `__init__.py` for a package), found without running it or its parent
    packages (`importlib.util.find_spec` would import the parents, and `fedlight.models` imports Lightning)."""
    parts = module.split(".")
    spec = None
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        if name in sys.modules and getattr(sys.modules[name], "__spec__", None) is not None:
            spec = sys.modules[name].__spec__
            continue
        path = None if depth == 1 else (spec.submodule_search_locations if spec is not None else None)
        if depth > 1 and path is None:
            return None
        spec = next(
            (
                found
                for finder in sys.meta_path
                if hasattr(finder, "find_spec")
                for found in [_find(finder, name, path)]
                if found is not None
            ),
            None,
        )
        if spec is None:
            return None
    return Path(spec.origin) if spec is not None and spec.origin and spec.origin.endswith(".py") else None


def _find(finder: Any, name: str, path: Any) -> Any:
    try:
        return finder.find_spec(name, path)
    except (ImportError, ValueError, AttributeError):
        return None


@functools.lru_cache(maxsize=None)
def read_module(module: str) -> tuple[dict[str, str], dict[str, ClassInfo]]:
    """(name -> dotted path it was imported from, class name -> ClassInfo) of one module's top level."""
    file = module_file(module)
    if file is None:
        return {}, {}
    tree = ast.parse(file.read_text(encoding="utf-8"))
    package = module if file.name == "__init__.py" else module.rpartition(".")[0]
    imported: dict[str, str] = {}
    classes: dict[str, ClassInfo] = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                imported[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(node.module or "", node.level, package)
            for alias in node.names:
                imported[alias.asname or alias.name] = f"{source}.{alias.name}"
        elif isinstance(node, ast.ClassDef):
            bases = [_dotted(base) for base in node.bases]
            info = ClassInfo(f"{module}.{node.name}", [b for b in bases if b], ast.get_docstring(node))
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    abstract = any(_dotted(d).endswith("abstractmethod") for d in item.decorator_list)
                    (info.abstract if abstract else info.defined).add(item.name)
            classes[node.name] = info
    for info in classes.values():
        info.bases = [_resolve_name(base, imported, classes, module) for base in info.bases]
    return imported, classes


def _absolute(module: str, level: int, package: str) -> str:
    if not level:
        return module
    parts = package.split(".")
    base = ".".join(parts[: len(parts) - level + 1])
    return f"{base}.{module}" if module else base


def _dotted(node: ast.expr) -> str:
    """`a.b.C` of a Name/Attribute expression ('' for anything else, e.g. a subscripted generic)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else ""
    return ""


def _resolve_name(name: str, imported: dict[str, str], classes: dict[str, ClassInfo], module: str) -> str:
    head, dot, rest = name.partition(".")
    if head in classes and not dot:
        return f"{module}.{head}"
    if head in imported:
        return imported[head] + dot + rest
    return name


@functools.lru_cache(maxsize=None)
def find_class(path: str) -> ClassInfo | None:
    """The definition of the class at dotted `path`, following re-exports (`from .x import C` in a package)."""
    module, _, name = path.rpartition(".")
    if not module:
        return None
    imported, classes = read_module(module)
    if name in classes:
        return classes[name]
    if name in imported and imported[name] != path:
        return find_class(imported[name])
    return None


def ancestors(path: str) -> list[str]:
    """`path` and every base it reaches (depth first, in MRO-like order), as dotted paths; bases outside readable
    source (lightning, torch) end the walk but are listed."""
    seen: list[str] = []

    def walk(p: str) -> None:
        if p in seen:
            return
        seen.append(p)
        info = find_class(p)
        for base in info.bases if info else []:
            walk(base)

    walk(path)
    return seen


def is_a(path: str, roots: set[str]) -> bool:
    """Whether the class at `path`, or some base it reaches (`ancestors`), is one of `roots`."""
    return any(a in roots for a in ancestors(path))


def is_abstract(path: str) -> bool:
    """Whether some base's abstract method is defined concretely nowhere between it and the class."""
    chain = [find_class(p) for p in ancestors(path)]
    concrete: set[str] = set()
    for info in chain:
        if info is None:
            continue
        if info.abstract - concrete:
            return True
        concrete |= info.defined
    return False


def exported_classes(package: str) -> dict[str, str]:
    """Public class name -> its dotted path, for what the package's `__init__.py` imports (or defines)."""
    imported, classes = read_module(package)
    found = {name: path for name, path in imported.items() if not name.startswith("_") and find_class(path)}
    found.update({name: info.path for name, info in classes.items() if not name.startswith("_")})
    return {name: (find_class(path).path) for name, path in found.items()}  # type: ignore[union-attr]


def kinds(package: str, roots: set[str], exclude: Collection[str] = frozenset()) -> dict[str, str]:
    """The concrete classes exported by `package` that derive from one of `roots`, not the roots themselves."""
    return dict(
        sorted(
            (name, path)
            for name, path in exported_classes(package).items()
            if path not in roots and path not in exclude and is_a(path, roots) and not is_abstract(path)
        )
    )


def components() -> dict[str, dict[str, str]]:
    """Everything `fedlight list` shows: algorithms, data modules, partition schemes, models (LightningModules),
    networks (torch modules to put in a model); plugins' entry points included."""

    def with_plugins(found: dict[str, str], group: str) -> dict[str, str]:
        return {**found, **{f"{name} (entry point)": path for name, path in short_names(group).items()}}

    lightning_modules = kinds(MODELS, LIGHTNING_MODULE)
    return {
        "algorithms": short_names(ALGORITHMS),
        "data modules": with_plugins(kinds(DATAMODULES, DATA_MODULE), DATAMODULES),
        "partition schemes": kinds(DATAMODULES, PARTITION_SCHEME),
        "models": with_plugins(lightning_modules, MODELS),
        "networks": kinds(MODELS, TORCH_MODULE, set(lightning_modules.values())),
    }


def describe(path: str) -> str:
    """The first sentence of the class's own docstring (one line), '' without one, or why it cannot be read."""
    info = find_class(path)
    if info is None:
        module, _, name = path.rpartition(".")
        read = module_file(module)
        return f"(cannot read: no class {name} in {module}{f' ({read})' if read else ''}{shadowed(module)})"
    if not info.doc or not info.doc.strip():
        return ""
    paragraph = " ".join(inspect.cleandoc(info.doc).split("\n\n", 1)[0].split())
    return first_sentence(paragraph)


def shadowed(module: str) -> str:
    """'; a folder X in the current directory hides ...' when the top package of `module` is found in the current
    directory, where `python -m` looks first: a project folder named like the package it installs (`pip install -e
    ./mypkg`, then run beside `mypkg/`) hides the installed package. '' otherwise."""
    top = module.partition(".")[0]
    spec = _find(importlib.machinery.PathFinder, top, None)
    if spec is None:
        return ""
    here = Path.cwd().resolve()
    places = [Path(p) for p in (spec.submodule_search_locations or [])] or ([Path(spec.origin)] if spec.origin else [])
    local = next((p for p in places if p.resolve().parent == here), None)
    if local is None:
        return ""
    return f"; {local} in the current directory hides any installed package named {top!r}: run from another folder"


def first_sentence(text: str, width: int = 100) -> str:
    """`text` up to its first full stop outside parentheses, cut at a word to `width` characters."""
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "." and depth <= 0 and (i + 1 == len(text) or text[i + 1] == " "):
            text = text[: i + 1]
            break
    return textwrap.shorten(text, width, placeholder=" ...")


#: where README.md's algorithm table begins and ends: the lines between are `algorithm_table()`, written by
#: `python -m fedlight.run.catalog --readme` (a test checks that they are), never edited by hand
TABLE_BEGIN = "<!-- algorithms: generated by `python -m fedlight.run.catalog --readme` from the registry -->"
TABLE_END = "<!-- end of algorithms -->"


def module_summary(module: str, width: int = 240) -> str:
    """The first sentence of a module's docstring (for an algorithm: its paper and what it does), read unrun."""
    file = module_file(module)
    doc = ast.get_docstring(ast.parse(file.read_text(encoding="utf-8"))) if file is not None else None
    if not doc:
        return ""
    return first_sentence(" ".join(doc.split("\n\n", 1)[0].split()), width)


def algorithm_table() -> str:
    """README's table of the registered algorithms: each one's short name and its module's first sentence."""
    rows = [
        f"| `{name}` | {module_summary(path.rpartition('.')[0]).replace('|', chr(92) + '|')} |"
        for name, path in sorted(short_names(ALGORITHMS).items())
    ]
    return "\n".join(["| algorithm | method (paper): what it does |", "|---|---|", *rows])


def with_algorithm_table(readme: str) -> str:
    """`readme` with the lines between `TABLE_BEGIN` and `TABLE_END` replaced by `algorithm_table()`."""
    if TABLE_BEGIN not in readme or TABLE_END not in readme:
        raise ValueError(f"README.md has no algorithm table markers ({TABLE_BEGIN} ... {TABLE_END})")
    head, rest = readme.split(TABLE_BEGIN, 1)
    return f"{head}{TABLE_BEGIN}\n{algorithm_table()}\n{TABLE_END}{rest.split(TABLE_END, 1)[1]}"


def main(argv: list[str] | None = None) -> None:
    """`python -m fedlight.run.catalog`: print README's algorithm table, or with `--readme` rewrite the table in that
    README (default README.md)."""
    import argparse

    parser = argparse.ArgumentParser(description="README's algorithm table, made from the registry")
    parser.add_argument(
        "--readme",
        type=Path,
        nargs="?",
        const=Path("README.md"),
        help="rewrite the table in this README (default README.md) instead of printing it",
    )
    options = parser.parse_args(argv)
    if options.readme is None:
        print(algorithm_table())
    else:
        options.readme.write_text(with_algorithm_table(options.readme.read_text()))


if __name__ == "__main__":
    main()
