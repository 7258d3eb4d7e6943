"""Which evaluated round a run's headline numbers come from, read off its evaluated rows (metrics.csv, or what the
runner keeps of them): the last round's (the summary's `<split>/*` as ever), the round chosen on validation data
(`val_selected/`, the round with the best mean validation metric: what tables report) and the best round on the
evaluated split itself (`<split>_selected/`, "test-selected": it chooses the model on the test set, as PFLlib's
best-over-rounds numbers do, so it is only for comparison with published tables). Each selection keeps the
worst-client value of its round beside the mean; a tie goes to the round with the lower mean loss on the split it
is chosen on, then to the later round (`best_row`); without validation numbers in every evaluated round the
validation-selected one is absent, and `no_val_selection` says why."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from fedlight.plugin.evaluation import higher_is_better

VALIDATION = "val"
VAL_SELECTED = "val_selected"
NO_VAL_SELECTION = "no_val_selection"  # summary.json: why a run has no validation-selected numbers
NO_VALIDATION = "no validation split"
PARTLY_VALIDATED = "validation not measured in every evaluated round"


def selected_prefix(split: str) -> str:
    """`test_selected` for the test split: the best round on the evaluated split itself."""
    return f"{split}_selected"


def metric_names(row: Mapping[str, Any], prefix: str) -> list[str]:
    """The per-client metrics summarized in `row` under `prefix` (the names of its `<prefix>/<name>_mean` keys)."""
    return [k[len(prefix) + 1 : -len("_mean")] for k in row if k.startswith(f"{prefix}/") and k.endswith("_mean")]


def primary_metric(names: Sequence[str]) -> str:
    """Accuracy when it is among a run's per-client metrics, else the first of them (acc for no metric at all)."""
    return "acc" if "acc" in names or not names else names[0]


def kept_keys(row: Mapping[str, Any], split: str) -> dict[str, Any]:
    """What a selection needs of an evaluated row: its round and the means and worst clients of the evaluated and
    the validation split."""
    return {
        k: v
        for k, v in row.items()
        if k == "round" or k.split("/", 1)[0] in (split, VALIDATION) and k.endswith(("_mean", "_worst"))
    }


def best_row(
    rows: Sequence[Mapping[str, Any]], key: str, higher: bool, tie_break: str | None = None
) -> Mapping[str, Any] | None:
    """The row with the best finite value of `key`; on a tie the one with the lowest finite `tie_break` (the chosen
    split's mean loss), then the latest round; None when no row has a finite value. Accuracy on small test sets ties
    often, and an early saturated round should not win a tie over a later one that fits better."""

    def rank(row: Mapping[str, Any]) -> tuple[float, float, float]:
        loss = row.get(tie_break) if tie_break is not None else None
        return (
            -row[key] if higher else row[key],
            loss if loss is not None and math.isfinite(loss) else math.inf,
            -row["round"],
        )

    finite = [row for row in rows if row.get(key) is not None and math.isfinite(row[key])]
    return min(finite, key=rank) if finite else None


def selections(rows: Sequence[Mapping[str, Any]], split: str, metric: str) -> dict[str, Any]:
    """The validation-selected and the `split`-selected round of `metric` over the evaluated rows (those with
    `<split>/<metric>_mean`), as summary keys: `<name>/round`, `<name>/<chosen on>` and the evaluated split's mean
    and worst client there; `no_val_selection` when no validation-selected round exists. With split `val` the two
    are one."""
    mean, worst = f"{split}/{metric}_mean", f"{split}/{metric}_worst"
    evaluated = [row for row in rows if mean in row]
    on_val = f"{VALIDATION}/{metric}_mean"
    validated = [row for row in evaluated if on_val in row]
    out: dict[str, Any] = {}
    if validated and len(validated) < len(evaluated):
        out[NO_VAL_SELECTION] = PARTLY_VALIDATED
    elif validated:
        out.update(_selected(validated, VAL_SELECTED, on_val, mean, worst, higher_is_better(metric)))
    if VAL_SELECTED + "/round" not in out:
        out.setdefault(NO_VAL_SELECTION, NO_VALIDATION)
    out.update(_selected(evaluated, selected_prefix(split), mean, mean, worst, higher_is_better(metric)))
    return out


def _selected(
    rows: Sequence[Mapping[str, Any]], name: str, on: str, mean: str, worst: str, higher: bool
) -> dict[str, Any]:
    row = best_row(rows, on, higher, tie_break=f"{on.split('/', 1)[0]}/loss_mean")
    if row is None:
        return {}
    return {
        f"{name}/round": int(row["round"]),
        f"{name}/{on}": row[on],
        f"{name}/{mean}": row[mean],
        f"{name}/{worst}": row.get(worst),
    }
