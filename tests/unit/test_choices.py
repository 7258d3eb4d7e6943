"""`fedlight.plugin.choices`: a mistyped name gets the nearest valid one; a name like none of them gets no guess."""

import pytest

from fedlight.plugin.choices import did_you_mean, unknown_choice


@pytest.mark.parametrize(
    "given, expected",
    [
        ("fedavgg", " (did you mean 'fedavg'?)"),  # one letter too many
        ("fedprxo", " (did you mean 'fedprox'?)"),  # two letters swapped
        ("resnet", ""),  # nothing close: no guess
    ],
)
def test_the_nearest_name_is_suggested_only_when_it_is_close(given, expected):
    assert did_you_mean(given, ["fedavg", "fedprox", "ditto"]) == expected


def test_the_error_names_the_setting_the_choices_and_the_value():
    error = unknown_choice("aggregator.rule", "meen", ["mean", "median"])
    assert str(error) == "aggregator.rule must be one of mean, median, got 'meen' (did you mean 'mean'?)"
