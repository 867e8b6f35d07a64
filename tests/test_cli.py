"""``wb``'s flags parse to what the library calls take (no servers: parsing only)."""

from __future__ import annotations

import pytest

from workbench.cli import build_parser


def test_wb_bisect_takes_patches_judge_trials_shape_and_ends_budget():
    parse = build_parser().parse_args
    args = parse(["bisect", "--commits", "v1..v2", "--patches", "a,b", "--judge", "all",
                  "--max-trials", "12", "--shape", "kills", "--ends-budget", "4"])
    assert (args.commits, args.patches, args.judge, args.max_trials, args.shape,
            args.ends_budget) == ("v1..v2", "a,b", None, 12, "kills", 4)
    plain = parse(["bisect", "--commits", "v1..v2"])
    assert (plain.judge, plain.max_trials, plain.ends_budget, plain.patches) == (2, None, 8, "")


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
