"""Checks of a `fit` command line and its config files that need no class: an unknown option or config key outside
the sections that name a class (data, model, algorithm, callbacks) is refused before the parser imports any data
module or model, so a typo is answered in about a second instead of after Lightning has loaded. What lies inside a
class's section is checked by the parser against the class's own signature, as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import yaml

from fedlight.run.config_errors import closest_key
from fedlight.run.config_upgrade import moved_key

#: sections whose keys depend on the class they name (checked by the parser once the class is imported); sections
#: typed as a whole (attack, privacy) are left to the parser too
CLASS_SECTIONS = ("data", "model", "algorithm", "callbacks")


def check_fit_arguments(arguments: list[str], options: Iterable[str]) -> None:
    """Refuse (ValueError, one line) an unknown `--option` or config key outside the class sections, as the parser
    would. `arguments` follow `fit`; `options` are the fit parser's option strings."""
    known = set(options)
    for i, token in enumerate(arguments):
        if token == "--":
            break  # what follows is not options
        if not token.startswith("--"):
            continue
        key = token[2:].split("=", 1)[0]
        if key == "config":
            path = token.split("=", 1)[1] if "=" in token else (arguments[i + 1] if i + 1 < len(arguments) else None)
            if path is not None and is_file(path):
                check_config_keys(Path(path), known)
        elif not _left_to_parser(key, known) and f"--{key}" not in known:
            if moved_key(key):
                raise ValueError(f"--{key} is now --{moved_key(key)} (the aggregator: section)")
            close = closest_key(key, known)
            hint = f" (did you mean --{close}?)" if close else " (see `fedlight fit --help`)"
            raise ValueError(f"unknown option --{key}{hint}; options are never abbreviated")


def is_file(path: str) -> bool:
    """Whether `path` names a file; False for a config given as YAML text (a resumed run's upgraded config)."""
    try:
        return "\n" not in path and Path(path).is_file()
    except OSError:  # a name too long for the file system
        return False


def check_config_keys(path: Path, known: set[str]) -> None:
    """Refuse an unknown top-level key of a run config file, or an unknown key of one of its plain sections
    (federation, logger), naming the key and the one probably meant."""
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return  # the parser reports an unreadable file in its own words
    if not isinstance(document, dict):
        return
    for key, value in document.items():
        if not isinstance(key, str) or _left_to_parser(f"{key}.", known):
            continue
        keys = [f"{key}.{sub}" for sub in value if isinstance(sub, str)] if isinstance(value, dict) else [key]
        for dotted in keys:
            if f"--{dotted}" not in known:
                if moved_key(dotted):
                    raise ValueError(
                        f"config key {dotted} is now {moved_key(dotted)} (the aggregator: section): "
                        f"move it there in {path}"
                    )
                close = closest_key(dotted, known)
                hint = f" (did you mean {close}?)" if close else " (see `fedlight fit --help` for the keys)"
                raise ValueError(f"unknown config key {dotted}{hint}")


def _left_to_parser(key: str, known: set[str]) -> bool:
    """Whether the parser alone can judge `key`: it lies in a class section, or in a section typed as a whole
    (`--attack`, `--privacy`: their keys are the type's, with no option of their own)."""
    head, dot, _ = key.partition(".")
    if head in CLASS_SECTIONS:
        return True
    own = [k for k in known if k.startswith(f"--{head}.") and k != f"--{head}.help"]
    return bool(dot) and f"--{head}" in known and not own
