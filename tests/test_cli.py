"""``wb``'s flags parse to what the library calls take (no servers: parsing only)."""

from __future__ import annotations

import argparse

import pytest

from workbench.cli import build_parser


def test_wb_bisect_builds_the_bisect_spec_from_its_flags():
    from workbench.cli.flags import spec_from_args
    from workbench.investigate import BisectSpec

    parse = build_parser().parse_args
    args = parse(["bisect", "--commits", "v1..v2", "--patches", "a,b", "--judge", "all",
                  "--max-trials", "12", "--shape", "kills", "--ends-budget", "4", "--repo", "x"])
    assert spec_from_args(BisectSpec, args) == BisectSpec(
        "v1..v2", "x", "kills", ("a", "b"), None, max_trials=12, ends_budget=4)
    assert spec_from_args(BisectSpec, parse(["bisect", "--commits", "v1..v2"])) == \
        BisectSpec("v1..v2")


def test_every_wb_bisect_flag_default_is_the_spec_s_or_the_series_function_s():
    """A flag left out sets nothing: ``--commits`` gets ``BisectSpec``'s default,
    ``--series`` ``bisect_patch_series``'s; the help shows both, nothing spells a third."""
    import dataclasses
    import inspect

    from workbench.cli import given
    from workbench.cli.parser import SERIES_SHARED
    from workbench.investigate import BisectSpec, bisect_patch_series

    sub = next(a for a in build_parser()._actions if a.dest == "cmd").choices["bisect"]
    acts = {a.dest: a for a in sub._actions}
    params = inspect.signature(bisect_patch_series).parameters
    for f in dataclasses.fields(BisectSpec):
        assert acts[f.name].default is argparse.SUPPRESS, f.name
        if f.name in SERIES_SHARED:
            assert f"{params[f.name].default!r}" in acts[f.name].help, f.name
    args = build_parser().parse_args(["bisect", "--series", "a,b", "--sessions", "3"])
    assert given(args, bisect_patch_series, (*SERIES_SHARED, "sessions")) == {"sessions": 3}


def test_wb_bisect_series_refuses_a_commit_only_flag(capsys):
    from workbench.cli import main

    with pytest.raises(SystemExit, match="shape are for --commits"):
        main(["bisect", "--series", "a,b", "--shape", "kills"])


def test_wb_investigate_takes_judge_trials_and_bursts_per_shape():
    parse = build_parser().parse_args
    args = parse(["investigate", "--judge", "5", "--max-trials", "80", "--bursts-per-shape", "3"])
    assert (args.judge, args.max_trials, args.bursts_per_shape) == (5, 80, 3)
    plain = parse(["investigate"])
    assert (plain.judge, plain.max_trials, plain.bursts_per_shape) == (2, 40, 1)
    assert parse(["investigate", "--judge", "0"]).judge == 0


@pytest.mark.parametrize("bad", ["-1", "some", "2.5", ""])
def test_a_judge_that_is_neither_a_count_nor_all_is_refused(bad, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bisect", "--judge", bad])
    assert "--judge wants a count >= 0 or 'all'" in capsys.readouterr().err
