"""Request dialects and the per-feature oracles: seeded draws, the body each sends, the oracles
on hand-built answers (failing where they must), and a control load on a real PD pair."""

from __future__ import annotations

import random

import pytest

from engine.registry import UnknownVariantError
from workbench.drive.dialects import DIALECTS, Feature, RequestParams, Turn, stop_from
from workbench.judge.features import length_ok, stop_cut, stop_ok, top1_ok, usage_ok

TURNS = [Turn("call", "get_weather", "get_weather says: {\"result\": \"sunny\"}", 64),
         Turn("answer", None, "get_weather says: {\"result\": \"sunny 21\"}", 64)]


def _draws(name: str, seed: int, n: int = 200) -> list[RequestParams]:
    rng = random.Random(seed)
    return [DIALECTS.get(name).draw(rng, TURNS[i % 2]) for i in range(n)]


def test_a_dialect_draws_the_same_params_from_the_same_seed():
    assert _draws("clients", 3) == _draws("clients", 3) != _draws("clients", 4)
    assert all(p == RequestParams() for p in _draws("greedy", 0, 10))


def test_agentic_and_clients_exercise_every_feature_they_name():
    agentic = {f for p in _draws("agentic", 0) for f in p.features()}
    clients = {f for p in _draws("clients", 0) for f in p.features()}
    assert agentic == {Feature.SAMPLED, Feature.TOP_P, Feature.STOP, Feature.UNSTREAMED,
                       Feature.TRUNCATED, Feature.TOOL_REQUIRED, Feature.TOOL_NAMED}
    assert clients == set(Feature)


def test_unknown_dialects_list_the_valid_ones():
    with pytest.raises(UnknownVariantError, match="valid: agentic, clients, greedy"):
        DIALECTS.get("chatty")


def test_params_refuse_an_unseeded_sample_and_put_their_features_in_the_body():
    with pytest.raises(ValueError, match="needs a seed"):
        RequestParams(temperature=0.7)
    p = RequestParams(0.8, 0.9, 5, stream=True, stop=(" x",), tool_choice="f", top_logprobs=2,
                      include_usage=True, ignore_eos=True)
    body = p.body()
    assert body["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert body["stream_options"] == {"include_usage": True} and body["stop"] == [" x"]
    assert "stream_options" not in RequestParams(stream=False, include_usage=True).body()


def test_a_stop_string_comes_from_the_answer_after_its_first_word():
    s = stop_from("a b c d", random.Random(0))
    assert s and s[0].startswith(" ") and s[0][1:] in {"b", "c", "d"}
    assert stop_from("short", random.Random(0)) == ()


def test_the_stop_oracle_wants_the_reference_text_up_to_the_first_match():
    pieces = ["he", "llo", " wor", "ld", ""]
    assert stop_cut(pieces, [" wo"]) == (3, "hello")
    assert stop_ok("hello", pieces, [" wo"], "stop") is True
    assert stop_ok("hello wor", pieces, [" wo"], "stop") is False  # the stop was sent
    assert stop_ok("hell", pieces, [" wo"], "stop") is False  # cut too early
    assert stop_ok("hello", pieces, [" wo"], "length") is False
    assert stop_ok("hello world", pieces, ["zz"], "stop") is None  # never fires: not judged


def test_the_length_oracle_wants_length_exactly_at_max_tokens():
    eos = 2
    assert length_ok([5, 6, 7], [5, 6, 7], 3, "length", False, eos, False) is True
    assert length_ok([5, 6], [5, 6, 7], 3, "length", False, eos, False) is False
    assert length_ok([5, 6, 7], [5, 6, 7], 3, "stop", False, eos, False) is False
    assert length_ok([5, eos], [5, eos], 3, "stop", False, eos, False) is True
    assert length_ok([5, eos, 9], [5, eos], 3, "length", True, eos, False) is True  # ignore_eos


def test_usage_and_top1_oracles():
    assert usage_ok({"completion_tokens": 3, "prompt_tokens": 4}, [1, 2, 3], [0] * 4) is True
    assert usage_ok({"completion_tokens": 2, "prompt_tokens": 4}, [1, 2, 3], [0] * 4) is False
    assert usage_ok(None, [1], None) is None
    assert top1_ok(["a", "b"], [[("a", -0.1), ("c", -2.0)], []]) is True
    assert top1_ok(["a"], [[("c", -0.1), ("a", -2.0)]]) is False


@pytest.mark.servers
@pytest.mark.nixl
def test_a_clients_load_on_a_correct_pd_pair_raises_no_alarm_and_reaches_every_oracle():
    """The control: every feature's oracle judges requests of a real pair and none fails (our
    engine is batch-invariant, so the false-alarm rate is zero)."""
    from workbench import launch_pd_pair
    from workbench.drive import inject_concurrency
    from workbench.judge.features import ORACLES

    with launch_pd_pair() as pair:
        res = inject_concurrency(pair, sessions=16, turns=2, seed=1, dialect="clients",
                                 progress=False)
    df = res.requests
    assert len(df) > 40 and int(df["flagged"].sum()) == 0, df.filter(df["flagged"])
    for name in ORACLES:
        judged = df[f"v_{name}_ok"].drop_nulls()
        assert len(judged) > 0 and judged.all(), name
    used = {f for s in df["features"] for f in s.split(",") if f}
    assert used == {f.value for f in Feature}, used
