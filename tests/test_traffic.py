"""Traffic files round-trip and refuse what is not a request; a failing burst found on one
deployment replays on another, and shrinks to a witness that fails again on a fresh pair."""

from __future__ import annotations

import pytest

from workbench.drive import Traffic, TrafficRequest

BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True,
        "stop": " x", "temperature": 0.7, "seed": 3,
        "tool_choice": {"type": "function", "function": {"name": "f"}}}


def test_a_traffic_file_round_trips_and_gives_each_request_its_features(tmp_path):
    tr = Traffic((TrafficRequest(0.0, BODY), TrafficRequest(0.5, BODY, 0.2, 1, 1, "call")))
    back = Traffic.read(tr.write(tmp_path / "t.traffic.jsonl"))
    assert back == tr and back.subset({1}).requests == (tr.requests[1],)
    p = back.requests[0].params()
    assert (p.stop, p.seed, p.tool_choice, p.stream, p.max_tokens) == ((" x",), 3, "f", True, 8)


def test_a_bad_traffic_line_is_named(tmp_path):
    bad = tmp_path / "bad.traffic.jsonl"
    bad.write_text('{"at_s": 0, "body": {}}\n{"body": {}}\n')
    with pytest.raises(ValueError, match=r"bad.traffic.jsonl:2: not a traffic request"):
        Traffic.read(bad)
    with pytest.raises(ValueError, match="arrival order"):
        Traffic((TrafficRequest(1.0, BODY), TrafficRequest(0.0, BODY)))


@pytest.mark.slow
@pytest.mark.servers
@pytest.mark.nixl
def test_a_failing_burst_shrinks_to_a_witness_that_fails_on_a_fresh_pair(tmp_path):
    """A zoo bug only stop strings reach: its agentic burst (28 requests) replays with the same
    flags from its traffic file, shrinks to at most 3 requests, and the witness, saved and read
    back, fails on a fresh pair."""
    from workbench import launch_pd_pair
    from workbench.drive import inject_concurrency, play, traffic_of
    from workbench.investigate import shrink, witness_rate

    bug = ["stream_stop_prefix_released"]
    with launch_pd_pair(patches=bug) as pair:
        res = inject_concurrency(pair, sessions=8, turns=2, seed=0, dialect="agentic",
                                 max_tokens=64, progress=False)
        assert res.requests["flagged"].any()
        trace = Traffic.read(traffic_of(res).write(tmp_path / "burst.traffic.jsonl"))
        assert len(trace) >= 12
        replayed = play(pair, trace).requests
        assert replayed["flagged"].sum() == res.requests["flagged"].sum()
        out = shrink(trace, pair)
    assert len(out.witness) <= 3 and out.complete, out.describe()
    witness = Traffic.read(out.witness.write(tmp_path / "witness.traffic.jsonl"))
    with launch_pd_pair(patches=bug) as fresh:
        rate = witness_rate(witness, fresh, runs=3)
    assert rate.failed == 3, rate.describe()
