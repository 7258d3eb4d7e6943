"""One line for a configuration error, cause first: the key, what is wrong with it, and what would be right.

jsonargparse explains a bad value by nesting every alternative it tried (a subclass, None, the union of both)
under a usage block. This module keeps what a person needs from that text: the dotted key as it would be typed,
and the innermost reason, with the options a class does accept or the option that was probably meant.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import re
from collections.abc import Iterable
from pathlib import Path

from fedlight.run.config_upgrade import moved_key

_NOT_ACCEPTED = re.compile(r"Option '([^']+)' is not accepted")
_CLASS_PATH = re.compile(r"Problem with given class_path '([^']+)'")
_PARSER_KEY = re.compile(r'Parser key "([^"]+)"')
_EXPECTED = re.compile(r"Expected a <class '(\w+)'>\. Got value: (.*)")
_UNRECOGNIZED = re.compile(r"unrecognized arguments: (.*)")
_IMPORT = re.compile(r"Expected a dot import path string: (.*)")
_MISSING = re.compile(r"No module named '[^']+'|module '[^']+' has no attribute '[^']+'")
_NOT_A_KEY = re.compile(r"does not accept option '([^']+)'")
_NO_FILE = re.compile(r'Parser key "([^"]+)": File does not exist: (.*)')


def explain(message: str, options: Iterable[str] = ()) -> str:
    """A one-line explanation of a jsonargparse error `message`; `options` are the parser's option strings, used
    to suggest the option that was probably meant."""
    unknown = _UNRECOGNIZED.search(message)
    if unknown:
        given = unknown.group(1).split()[0].split("=", 1)[0]
        if moved_key(given):
            return f"{given.lstrip('-')} is now {moved_key(given)} (the aggregator: section): give --{moved_key(given)}"
        close = closest_key(given.lstrip("-"), options)
        hint = f" (did you mean --{close}?)" if close else " (see `fedlight fit --help`)"
        return f"unknown option {given}{hint}; options are never abbreviated"
    not_a_key = _NOT_A_KEY.search(message)
    if not_a_key:  # a key of a config file (or of a section given as a whole), top level or nested
        given = not_a_key.group(1)
        if moved_key(given):
            return f"config key {given} is now {moved_key(given)} (the aggregator: section): move it there"
        close = closest_key(given, options)
        hint = f" (did you mean {close}?)" if close else " (see `fedlight fit --help` for the keys)"
        return f"unknown config key {given}{hint}"
    no_file = _NO_FILE.search(message)
    if no_file:
        return _no_such_file(no_file.group(1), no_file.group(2).strip().strip("'\""))
    keys = _PARSER_KEY.findall(message)
    option = _NOT_ACCEPTED.search(message)
    if option:
        classes = _CLASS_PATH.findall(message)
        key = ".init_args.".join(keys + [option.group(1)]) if keys else option.group(1)
        accepted = _init_options(classes[-1]) if classes else []
        matches = difflib.get_close_matches(option.group(1), accepted, n=1, cutoff=0.75)
        meant = f" (did you mean {matches[0]}?)" if matches else ""
        listed = f"; its options are {', '.join(accepted)}" if accepted else ""
        owner = classes[-1] if classes else "this section"
        return f"{key}: {owner} has no option {option.group(1)!r}{meant}{listed}"
    classes = _CLASS_PATH.findall(message)
    missing = _MISSING.search(message)
    if missing and classes and keys:
        return (
            f"{keys[-1]}: cannot import {classes[-1]} ({missing.group(0).strip()}); check the spelling, or "
            "`python -m fedlight list` for what is installed"
        )
    expected = _EXPECTED.search(message)
    if expected and keys:
        return f"{keys[-1]}: expected {_article(expected.group(1))}, got {expected.group(2).strip()!r}"
    importable = _IMPORT.search(message)
    if importable and keys:
        return (
            f"{keys[-1]}: {importable.group(1).strip()!r} is neither a known name nor an importable class path "
            "(`python -m fedlight list` shows what is installed)"
        )
    lines = [
        line.strip(" -")
        for line in message.splitlines()
        if line.strip()
        and not line.strip().startswith(
            ("Given value", "Subtypes:", "Errors:", "Does not validate", "- Expected a <class 'NoneType'>")
        )
    ]
    return "; ".join(dict.fromkeys(lines[:1] + lines[-1:]))


def closest_key(given: str, options: Iterable[str]) -> str | None:
    """The dotted key that `given` (a dotted key, no dashes) probably meant, among the parser's option strings:
    the closest whole key, or else `given` with its misspelt first part (the top-level section or setting)
    corrected, e.g. federaton.rounds -> federation.rounds, modle.init_args.lr -> model.init_args.lr."""
    keys = [o[2:].rstrip("+") for o in options if o.startswith("--")]
    close = difflib.get_close_matches(given, keys, n=1, cutoff=0.75)
    if close and close[0] != given:
        return close[0]
    head, dot, rest = given.partition(".")
    heads = {key.split(".", 1)[0] for key in keys}
    close_head = difflib.get_close_matches(head, sorted(heads - {head}), n=1, cutoff=0.7)
    if head in heads or not close_head:
        return None
    corrected = close_head[0] + dot + rest
    # a misspelt setting under the corrected section too (federaton.roundz): the closest key there, if any
    close = difflib.get_close_matches(corrected, [k for k in keys if k.startswith(close_head[0])], n=1, cutoff=0.75)
    return close[0] if close else corrected


def _no_such_file(key: str, path: str) -> str:
    """'--config configs/nope.yaml: no such file ...': the path relative to the current folder when it lies
    inside it (as it was most likely typed), with a hint that relative paths are read from there."""
    try:
        shown = Path(path).relative_to(Path.cwd()) if Path(path).is_absolute() else Path(path)
    except ValueError:
        return f"--{key} {path}: no such file"
    return (
        f"--{key} {shown}: no such file (check the path: relative paths are read from the current folder, "
        f"{os.getcwd()})"
    )


def _init_options(class_path: str) -> list[str]:
    """The keyword arguments a class's constructor takes (through its bases when it forwards **kwargs)."""
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return []
    found: list[str] = []
    for klass in inspect.getmro(cls):
        if "__init__" not in vars(klass):
            continue
        parameters = inspect.signature(vars(klass)["__init__"]).parameters.values()
        found += [p.name for p in parameters if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if not any(p.kind == p.VAR_KEYWORD for p in parameters):
            break
    return list(dict.fromkeys(found))


def _article(type_name: str) -> str:
    return {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}.get(
        type_name, f"a {type_name}"
    )
