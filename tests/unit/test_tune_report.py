"""The tuning report's search history: the best-so-far curve over completed trials, worked by hand, and a page
that lists every trial with its state."""

from __future__ import annotations

import numpy as np

from fedlight.reports.tune_report import TrialRecord, best_so_far, write

RECORDS = [
    TrialRecord(0, "complete", 0.2, {"lr": 0.1}),
    TrialRecord(1, "pruned", 0.5, {"lr": 0.3}, last_round=2),
    TrialRecord(2, "complete", 0.1, {"lr": 0.01}),
    TrialRecord(3, "complete", 0.4, {"lr": 0.05}),
    TrialRecord(4, "fail", None, {"lr": 0.9}),
]


def test_best_so_far_follows_only_the_completed_trials_in_the_studys_direction():
    numbers, best = best_so_far(RECORDS, maximize=True)
    assert numbers.tolist() == [0, 2, 3] and np.allclose(best, [0.2, 0.2, 0.4])  # the pruned 0.5 is no result
    numbers, best = best_so_far(RECORDS, maximize=False)
    assert numbers.tolist() == [0, 2, 3] and np.allclose(best, [0.2, 0.1, 0.1])


def test_a_search_page_without_final_runs_lists_every_trial_and_both_figures(tmp_path):
    page = write(tmp_path / "report.html", "study", RECORDS, {"lr": 1.0}, "val/acc_mean", "maximize").read_text()
    assert page.count("<tr data-state=") == 5 and "data-state='pruned'" in page and "data-state='fail'" in page
    assert "fig-history" in page and "fig-importance" in page and "5 trials on the validation split" in page
