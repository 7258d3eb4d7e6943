"""One error for a value outside a fixed set of names: the setting, what was given, the nearest name when one is close
(a typo), and the names to choose from."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(given: object, choices: Iterable[str]) -> str:
    """' (did you mean NAME?)' for the closest of `choices` to `given`, or '' when none is close."""
    close = difflib.get_close_matches(str(given), list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_choice(setting: str, given: object, choices: Iterable[str], also: str = "") -> ValueError:
    """'SETTING must be one of A, B, C ALSO, got GIVEN (did you mean B?)', to raise."""
    choices = list(choices)
    return ValueError(
        f"{setting} must be one of {', '.join(choices)}{also}, got {given!r}{did_you_mean(given, choices)}"
    )
