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
    assert (plain.judge, plain.max_trials, plain.ends_budget, plain.patches) == (2, None, None, "")


def test_wb_bisect_leaves_the_library_s_defaults_to_the_library():
    """A flag the library owns defaults to None and is not passed: the called function's own
    default applies (its help says which); the rest equal the function's defaults."""
    import inspect

    from workbench.cli import _LIBRARY_OWNED, given
    from workbench.investigate import bisect_commits, bisect_patch_series

    sub = next(a for a in build_parser()._actions if a.dest == "cmd").choices["bisect"]
    acts = {a.dest: a for a in sub._actions}
    for name in _LIBRARY_OWNED:
        assert acts[name].default is None and "the library's" in acts[name].help, name
    params = inspect.signature(bisect_commits).parameters
    for name in ("judge", "deployments", "workers", "address", "patches"):
        want = params[name].default
        assert acts[name].default in (want, "" if want == () else want), name
    args = build_parser().parse_args(["bisect", "--series", "a,b", "--sessions", "3"])
    assert given(args, bisect_patch_series, _LIBRARY_OWNED) == {"sessions": 3}
    assert given(args, bisect_commits, _LIBRARY_OWNED) == {}  # it takes no sessions


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
