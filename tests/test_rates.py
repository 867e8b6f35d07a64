"""Wilson intervals and the rate plot: pure functions, no servers."""

from __future__ import annotations

import math

import matplotlib
import polars as pl
import pytest

from workbench.drive import wilson

matplotlib.use("Agg")


def test_wilson_brackets_the_rate_exactly_for_every_k_and_n_up_to_1000():
    for n in range(1, 1001):
        for k in range(n + 1):
            lo, hi = wilson(k, n)
            assert 0.0 <= lo <= k / n <= hi <= 1.0, (k, n, lo, hi)
        assert wilson(0, n)[0] == 0.0 and wilson(n, n)[1] == 1.0, n


def test_wilson_edges_and_bad_counts():
    assert wilson(0, 0) == (0.0, 1.0)
    assert wilson(0, 11)[0] == 0.0 and 0.0 < wilson(0, 11)[1] < 0.3
    lo, hi = wilson(5, 10)
    assert math.isclose(lo + hi, 1.0) and lo < 0.5 < hi
    for k, n in ((-1, 3), (4, 3)):
        with pytest.raises(ValueError):
            wilson(k, n)


def test_plot_rates_renders_a_clean_run_and_a_rounded_interval():
    from workbench.report.plots import plot_rates

    lo, hi = wilson(0, 11)
    rows = pl.DataFrame({"variant": ["clean", "rounded"], "rate": [0.0, 0.3],
                         "lo": [lo, 0.3 + 1e-16], "hi": [hi, 0.5]})
    fig = plot_rates(rows)
    fig.canvas.draw()
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["clean", "rounded"]
