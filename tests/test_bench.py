"""The bench suite's summary table: formatting and each benchmark's row (no timing assertions)."""

from __future__ import annotations

import math
from datetime import datetime, timezone

from bench.bisect_sim import BisectSim, Cell
from bench.decode_throughput import DecodeThroughput
from bench.dump_overhead import DumpOverhead
from bench.monitor_overhead import MonitorOverhead
from bench.nixl_bandwidth import NixlBandwidth, Row
from bench.repro_time import Burst, ReproTime, Run
from bench.table import TableRow, fmt_ratio, header, markdown_table


def test_markdown_table_has_one_row_per_benchmark_and_escapes_pipes():
    rows = [TableRow("a", "x | y", 2.0, "b / c"), TableRow("b", "failed", None, ""),
            TableRow("c", "p", 0.8, "P", ratio_text="4/5")]
    lines = markdown_table(rows).splitlines()
    assert lines[0] == "| benchmark | measured | ratio | ratio of |"
    assert lines[1] == "| --- | --- | --- | --- |"
    assert lines[2] == "| a | x \\| y | 2.00x | b / c |"
    assert lines[3] == "| b | failed | n/a |  |"
    assert lines[4] == "| c | p | 4/5 | P |"
    assert len(lines) == 5


def test_fmt_ratio():
    assert fmt_ratio(1.234) == "1.23x"
    assert fmt_ratio(0.0123) == "0.012x"
    assert fmt_ratio(math.inf) == "inf"
    assert fmt_ratio(None) == fmt_ratio(math.nan) == "n/a"


def test_header_names_date_and_cores():
    h = header(datetime(2026, 1, 2, 3, 4, tzinfo=timezone.utc))
    assert h.startswith("measured 2026-01-02 03:04 UTC on ") and " cores, " in h


def _run(seed: int, first: float | None, cap: float = 60.0) -> Run:
    return Run(("p",), seed, cap, 5.0, first, 40.0, 1, 10, int(first is not None))


def test_benchmark_results_build_rows():
    repro = ReproTime(60.0, Burst(), (_run(0, 30.0), _run(1, 70.0), _run(2, None)),
                      Run((), 3, 60.0, 5.0, None, 60.0, 2, 24, 0))
    assert repro.reproduced == 1 and repro.p_within_cap == 1 / 3
    assert math.isinf(repro.median_s)  # 2 of 3 runs did not reproduce within the cap
    row = repro.table_row()
    assert "> 60 s" in row.measured and "0 flags in 24" in row.measured
    assert row.cells()[2] == "0.33 (1/3)"
    cell = {m: Cell(m, 0.05, 16, 20, 1.0, t, 0.1) for m, t in
            (("bayes", 50.0), ("told", 40.0), ("fixed", 100.0), ("fixed@5%", 100.0),
             ("fixed95", 120.0), ("fixed@1%", 200.0))}
    rows = [
        repro.table_row(),
        DecodeThroughput(32, "torch", 10.0, 80.0).table_row(),
        MonitorOverhead(4, 3.0, 6, 1.0, (20.0, 40.0), (21.0, 44.0), 900, 880, 18,
                        12.0).table_row(),
        NixlBandwidth((Row(64, "coalesced", 1, 4.0, 8.0), Row(64, "per-page", 1024, 2.0, 8.0)),
                      65536, 1).table_row(),
        BisectSim(20, 0.97, (0.3, 3.0), {0.05: [cell]}).table_row(),
        DumpOverhead(4, 2.0, 10, 0.1, (20.0, 50.0), (22.0, 100.0), 100, 90, 50.0, 45.0, 30, 0,
                     80.0, 300.0).table_row(),
    ]
    assert [r.ratio for r in rows] == [1 / 3, 8.0, 1.1, 0.5, 0.5, 2.0]
    assert len(markdown_table(rows).splitlines()) == 2 + len(rows)


def test_info_bound_is_log2_n_for_a_deterministic_bug_and_grows_as_the_rate_falls():
    from bench.bisect_sim import info_bound

    assert math.isclose(info_bound(1.0, 64, error=0.0), 6.0, rel_tol=1e-6)
    assert info_bound(0.01, 64) > info_bound(0.05, 64) > info_bound(0.20, 64) > 0


def test_soak_row_counts_served_correct_over_requests_not_killed():
    from bench.soak import SoakResult

    res = SoakResult(1, 256, 2, 1000, 250, 740, 0, {"502: KV transfer failed": 10}, {}, {"d": 3},
                     {"decode0": (900.0, 1000.0, 1010.0), "prefill0": (800.0, 850.0, 849.0)},
                     600.0)
    row = res.table_row()
    assert res.not_killed == 750 and row.ratio == 740 / 750
    assert "10 errors" in row.measured and "growth after round 1 10 MiB" in row.measured
    assert row.measured.startswith("1 corrupted answers")


def test_sim_row_is_sim_over_real_time_to_first_failure():
    from bench.sim import SimBench

    b = SimBench(200, 0, 3, 4.0, 100, 100, 2.2, 2.0, 40.0, 2)
    assert b.speedup == 0.1 and abs(b.overhead - 1.1) < 1e-9
    assert "identical 100/100" in b.table_row().measured


def test_sim_rare_row_is_the_worst_pct_count_over_a_thousand():
    from bench.sim_rare import RareRow, SimRare

    rows = (RareRow("a", 7, 3.0, 2, 1.0, 50, 0), RareRow("b", 40, 9.0, None, 90.0, 50, 1))
    row = SimRare(rows).table_row()
    assert row.ratio == 40 / 1000 and "real 0/50" in row.measured and "walk None" in row.measured
    assert rows[0].real_hi < 0.08 and SimRare((RareRow("c", None, 1, None, 1, 0, 0),)
                                              ).table_row().ratio is None


def test_sim_pd_row_is_bugs_found_over_bugs():
    from bench.sim_pd import FoundRow, SimPD

    rows = (FoundRow("a", "kills", 1, 5, 12.0, "1 late writes", 3, 3),
            FoundRow("b", None, None, 15, 90.0, "", 0, 0))
    row = SimPD(rows, 10, 0).table_row()
    assert row.ratio == 0.5 and "1/2 zoo bugs" in row.measured
    assert "replayed identically" in row.measured and "0 failing of 10" in row.measured


def test_sim_scale_row_counts_variants_found_and_replayed_identically():
    from bench.sim_pd import FoundRow
    from bench.sim_scale import SimScale

    rows = (FoundRow("a", "kills", 3, 4, 30.0, "1 late writes", 100, 100),
            FoundRow("b", "baseline", 1, 2, 20.0, "1 flagged", 99, 100),
            FoundRow("c", None, None, 15, 90.0, "", 0, 0))
    row = SimScale(rows, 10_000, (), 3_000_000, 3600.0).table_row()
    assert row.ratio == 1 / 3 and "1/3 failing variants" in row.measured
    assert "0 failing of 10000 schedules" in row.measured


def test_progress_row_is_stock_over_paced_latency_of_the_first_backend():
    from bench.nixl_progress import PairFigures, ProgressPacing

    figs = (PairFigures("vllm", 0, 1.99, 1.0, 1), PairFigures("vllm", 1000, 0.06, 0.5, 0),
            PairFigures("embedded", 0, 1.9, 0.08, 0), PairFigures("embedded", 1000, 0.05, 0.04, 0))
    row = ProgressPacing(figs).table_row()
    assert row.ratio == 2.0 and row.measured.startswith("vllm: idle 1.99 -> 0.06 cores")
    assert "errors 1 -> 0" in row.measured and "embedded" in row.measured


def test_sim_throughput_row_is_two_workers_over_one_and_checks_identity():
    from bench.sim_throughput import Throughput, Verdict, Way

    same = (Verdict(0, False, "a"), Verdict(1, True, "b"))
    res = Throughput((Way("in process", same, 10.0), Way("ray, 2 workers", same, 5.0, 2.0)))
    assert res.ratio() == 2.0 and res.identical
    assert "identical" in res.table_row().measured
    other = Way("ray, 2 nodes", (Verdict(0, False, "a"), Verdict(1, True, "c")), 5.0)
    assert not Throughput((*res.ways, other)).identical
