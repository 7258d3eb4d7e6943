"""The API reference: HTML pages made from the docstrings by pdoc, offline, and the check that every public name has
a docstring to make them from.

    python -m fedlight.run.api_reference --out docs/api      # then open docs/api/index.html

A public name is a module, or a class or function a module defines (not one it imports) whose name does not start
with an underscore, and each public method or property of such a class; a method documented where it is first
defined (a hook of `Algorithm`) counts as documented where it is overridden.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil
import warnings
from pathlib import Path
from types import ModuleType

#: the packages the reference covers (algorithms, models and data modules are installed under fedlight)
PACKAGES = ("fedlight", "fedlight.algorithms", "fedlight.models", "fedlight.datamodules")
#: modules left out: running the command line is what importing `fedlight.__main__` does
SKIPPED = ("fedlight.__main__",)


def modules() -> list[ModuleType]:
    """Every public module of `PACKAGES`, imported."""
    found: dict[str, ModuleType] = {}
    for package in PACKAGES:
        root = importlib.import_module(package)
        found[package] = root
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if info.name not in SKIPPED and not info.name.rpartition(".")[2].startswith("_"):
                found[info.name] = importlib.import_module(info.name)
    return list(found.values())


def public_members(cls: type) -> list[tuple[str, object]]:
    """(name, the attribute as looked up on `cls`) of the public methods and properties `cls` itself defines."""
    members = []
    for name, value in vars(cls).items():
        if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property)):
            members.append((name, value if isinstance(value, property) else getattr(cls, name)))
    return members


def undocumented() -> list[str]:
    """Qualified names of the public modules, classes, functions, methods and properties without a docstring."""
    missing = []
    for module in modules():
        if not (module.__doc__ or "").strip():
            missing.append(module.__name__)
        for name, value in vars(module).items():
            if name.startswith("_") or getattr(value, "__module__", None) != module.__name__:
                continue
            if not (inspect.isclass(value) or inspect.isfunction(value)):
                continue
            if not (inspect.getdoc(value) or "").strip():
                missing.append(f"{module.__name__}.{name}")
            if inspect.isclass(value):
                missing += [
                    f"{module.__name__}.{name}.{member}"
                    for member, attribute in public_members(value)
                    if not (inspect.getdoc(attribute) or "").strip()
                ]
    return missing


def build(out: Path, packages: tuple[str, ...] | None = None) -> Path:
    """Write the reference's HTML pages into `out` (of `packages` and their modules, default every one of
    `PACKAGES`); returns the index page."""
    import pdoc

    names = [m.__name__ for m in modules() if packages is None or m.__name__.startswith(tuple(packages))]
    pdoc.render.configure(docformat="google", show_source=False, search=True)
    with warnings.catch_warnings():  # every module is named (a package's `__all__` hides its submodules from
        warnings.filterwarnings("ignore", message=".*has already been added")  # pdoc), so pdoc meets some twice
        pdoc.pdoc(*names, output_directory=out)
    return out / "index.html"


def main(argv: list[str] | None = None) -> None:
    """`python -m fedlight.run.api_reference`: say how many public names lack a docstring (if any), write the pages
    into `--out` and print the index page's path."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/api"), help="the folder the pages go into")
    options = parser.parse_args(argv)
    missing = undocumented()
    if missing:
        print(f"{len(missing)} public names have no docstring, e.g. {', '.join(missing[:5])}")
    print(f"API reference: {build(options.out)}")


if __name__ == "__main__":
    main()
