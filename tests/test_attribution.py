"""Attribution to every component (issue 25): request identity in dumps, rooms that carried two
requests (router), tokens handed to the wrong request (engine loop) or off the greedy choice
(sampling), and log lines as evidence. Pure tests, plus one real pair with the engine-loop bug."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter

import polars as pl
import pytest
import torch
from safetensors.torch import save as st_save

from engine.core.dump import RequestIdentity, identity_metadata, prompt_hash, read_metadata
from workbench.investigate import diagnose
from workbench.investigate.bursts import BURST_COLUMNS, Burst, Reproduction
from workbench.observe import Stage
from workbench.observe.attribution import (
    OffGreedy,
    attribute_tokens,
    off_greedy,
    room_conflict,
    shared_rooms,
    stream_departure,
)
from workbench.observe.buffers import BufferDump, parse_dump
from workbench.observe.localize import Localization, localize
from workbench.observe.logs import log_evidence


def test_identity_round_trips_through_a_dump_blob():
    tensors = {"tokens": torch.tensor([1, 2, 3]), "prompt": torch.tensor([1, 2, 3]),
               "num_cached": torch.tensor([0]), "output": torch.tensor([9]),
               "layer0.k": torch.zeros(3, 2, 4)}
    named = (("room-7", prompt_hash([1, 2, 3])), ("room-7", prompt_hash([4, 5])))
    blob = st_save(tensors, metadata=identity_metadata("room-7", tensors, named))
    ident = RequestIdentity.from_metadata(read_metadata(blob))
    assert ident == RequestIdentity("room-7", prompt_hash([1, 2, 3]), named)
    assert RequestIdentity.from_metadata(ident.to_metadata()) == ident
    assert parse_dump(blob, "decode:7").identity == ident
    assert prompt_hash([1, 2, 3]) != prompt_hash([1, 2, 4]) and len(prompt_hash([])) == 16
    assert RequestIdentity.from_metadata({"rid": "x"}) is None  # an old dump: no identity
    assert parse_dump(st_save(tensors), "old").identity is None


def test_a_room_that_carried_two_requests_is_not_compared_as_one():
    a, b = prompt_hash([1, 2]), prompt_hash([3, 4])
    one = RequestIdentity("room-5", a, (("room-5", a),))
    assert room_conflict(5, one, one) == "" and room_conflict(5, one, one, sent=a) == ""
    assert room_conflict(5, None, None) == ""  # dumps without identity: nothing to say
    two = room_conflict(5, one, RequestIdentity("room-5", b, (("room-5", b),)))
    assert two.startswith("room 5 carried two requests") and a in two and b in two
    seen = room_conflict(5, RequestIdentity("room-5", a, (("room-5", a), ("room-5", b))), one)
    assert "the prefill saw 2 requests name it" in seen
    assert "the client sent prompt" in room_conflict(5, one, one, sent=b)

    class Source:  # a DumpSource whose room holds two requests' dumps
        def engine_config(self):
            raise AssertionError("a conflicting room needs no reference")

        def room_dumps(self, room):
            pre = BufferDump("p", [1, 2], {}, identity=one)
            return pre, BufferDump("d", [3, 4], {}, identity=RequestIdentity("room-5", b))

    loc = localize(Source(), 5, reference=object())
    assert loc.conflict.startswith("room 5 carried two requests") and loc.first is None
    diag = diagnose(_rep(), [loc])
    assert (diag.stage, diag.kind, diag.basis) == (Stage.ROUTER, "shared_room", "identity")
    assert diag.describe().startswith("router (shared_room): room 5 carried two requests")


def test_the_client_sees_two_requests_given_one_room():
    frame = pl.DataFrame([{"room": 8, "started_at": 1.0, "prompt_hash": "a"},
                          {"room": 8, "started_at": 1.25, "prompt_hash": "b"},
                          {"room": 3, "started_at": 1.0, "prompt_hash": "c"},
                          {"room": None, "started_at": 2.0, "prompt_hash": "d"}])
    [one] = shared_rooms(frame)
    assert one == ("room 8 carried two requests: 2 client requests were given it within "
                   "0.25 s (prompts a, b)")
    assert shared_rooms(frame.filter(pl.col("room") != 8)) == [] == shared_rooms(pl.DataFrame())
    rep = dataclasses.replace(_rep(), requests=frame.with_columns(
        pl.lit(False).alias("flagged"), pl.lit("").alias("error"), pl.lit(False).alias("killed"),
        pl.col("started_at").alias("ended_at")))
    assert diagnose(rep, []).stage is Stage.ROUTER


def test_a_failed_room_testifies_with_its_captures_identities(tmp_path):
    from workbench.observe.buffers import capture_name, load_identity

    t = {"tokens": torch.tensor([1, 2]), "prompt": torch.tensor([1, 2])}
    mine, theirs = prompt_hash([1, 2]), prompt_hash([3])
    both = (("room-6", theirs), ("room-6", mine))
    paths = []
    for role in ("prefill", "decode"):
        paths.append(tmp_path / capture_name(6, role))
        paths[-1].write_bytes(st_save(t, metadata=identity_metadata("room-6", t, both)))
    assert load_identity(paths[0]).room_requests == both
    frame = pl.DataFrame([{"room": 6, "flagged": False, "error": "502", "killed": False,
                           "prompt_hash": mine, "started_at": 1.0, "ended_at": 2.0}])
    rep = dataclasses.replace(_rep(), requests=frame, captures=tuple(paths))
    diag = diagnose(rep, [])
    assert diag.stage is Stage.ROUTER and "the prefill saw 2 requests name it" in diag.detail


def test_the_room_refill_race_gives_two_waiting_requests_one_room():
    import asyncio
    import random

    from engine.router.variants import RouterHooks
    from engine.variants import hooks_for

    class Router:
        room_rng = random.SystemRandom()

    async def draws(hooks) -> list[int]:
        first = [await hooks.draw_room(Router) for _ in range(4)]  # the first block, in order
        return first + list(await asyncio.gather(*(hooks.draw_room(Router) for _ in range(3))))

    buggy = hooks_for(RouterHooks, ["router_room_block_refill_race"])
    buggy.REFILL_S = 0.0
    rooms = asyncio.run(draws(buggy))
    assert len(set(rooms[:4])) == 4 and rooms[4] == rooms[5] == rooms[6]
    fixed = asyncio.run(draws(hooks_for(RouterHooks, [])))
    assert len(set(fixed)) == 7


def test_stages_are_ordered_along_the_request_path():
    assert list(Stage) == [Stage.ROUTER, Stage.PREFILL, Stage.TRANSFER, Stage.DECODE,
                           Stage.SAMPLING, Stage.ENGINE_LOOP, Stage.SERVING]


def test_off_greedy_tokens_name_the_engine_loop_or_the_sampler():
    greedy = lambda toks: [(t + 1) % 50 for t in toks]  # noqa: E731 - the reference's argmax
    assert off_greedy(1, [10, 11], [12, 13, 14], greedy) is None
    off = off_greedy(1, [10, 11], [12, 40, 41], greedy)
    assert off == OffGreedy(1, 1, 2, 40, 13)
    swap = [OffGreedy(1, 3, 40, 7, 8), OffGreedy(2, 5, 50, 8, 7), OffGreedy(3, 1, 9, 4, 7)]
    loop = attribute_tokens(swap)
    assert loop.component == "engine_loop" and "room 1 got token 7" in loop.detail
    one_way = [OffGreedy(1, 3, 40, 7, 8), OffGreedy(2, 5, 50, 9, 7)]  # coincidence, not a swap
    assert attribute_tokens(one_way).component == "sampling"
    assert attribute_tokens([]) is None
    locs = [Localization(o.room, 10, 0, (), 4, off_greedy=o) for o in swap]
    diag = diagnose(_rep(), locs)
    assert (diag.stage, diag.kind, diag.basis) == (Stage.ENGINE_LOOP, "token_handoff", "tokens")
    alone = diagnose(_rep(), locs[2:])
    assert (alone.stage, alone.basis) == (Stage.SAMPLING, "tokens")
    assert stream_departure(4, [1, 2], [1, 2, 3]) == ""  # a stream cut short
    assert stream_departure(4, None, [1]) == "" == stream_departure(4, [1, 2, 3], [1, 2])
    carried = stream_departure(4, [1, 9, 3], [1, 2, 3])
    assert carried.startswith("room 4: the client received token 9 at step 1")
    fed = diagnose(_rep(), [Localization(4, 10, 0, (), 4, stream=carried)])
    assert (fed.stage, fed.kind, fed.basis) == (Stage.ENGINE_LOOP, "stream_handoff", "tokens")
    buffers = diagnose(_rep(), [Localization(9, 10, 0, (), 4)])
    assert buffers.stage is None  # equal buffers and greedy tokens: still not localized


def test_log_lines_near_the_flagged_request_are_quoted_with_their_file(tmp_path):
    now = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    old = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now - 3600))
    (tmp_path / "router.log").write_text(
        f"{stamp},120 engine.router prefill http://x answered 400 for room 42: already used\n"
        f"{stamp},130 engine.router router on 127.0.0.1\n"
        f"{old},000 engine.router prefill http://x answered 502 for room 9: gone\n")
    (tmp_path / "decode0.log").write_text(f"{stamp},500 engine.disagg WARNING slot 3 failed\n"
                                          "Traceback (most recent call last):\n")
    lines = log_evidence(tmp_path, rooms=[42], window=(now - 5, now + 5))
    assert [ln.describe().split(" ", 1)[0] for ln in lines] == ["router.log:", "decode0.log:"]
    assert lines[0].named and "room 42" in lines[0].line and not lines[1].named
    assert log_evidence(tmp_path / "missing", rooms=[42]) == ()
    frame = pl.DataFrame([{"room": 42, "flagged": True, "error": "", "killed": False,
                           "started_at": now - 1, "ended_at": now}])
    rep = Reproduction("v", (), (0,), _rep().bursts, frame, (), 0.0, 1.0, {}, {},
                       log_dir=str(tmp_path))
    logs = diagnose(rep, []).logs
    assert logs[0].startswith("router.log: ") and "room 42" in logs[0]


def _rep() -> Reproduction:
    row = Burst(seed=0, requests=10, flagged=1, leaked=0, mismatched=1, dropped=0)
    frame = pl.DataFrame([row.__dict__], schema=BURST_COLUMNS)
    return Reproduction("v", (), (0,), frame, pl.DataFrame(), (), 0.0, 1.0, {}, {},
                        reasons=Counter())


@pytest.mark.slow
@pytest.mark.zoo
@pytest.mark.servers
@pytest.mark.nixl
def test_engine_loop_token_handoff_is_found_and_attributed(tmp_path):
    """One turn of the baseline shape (the handoff needs requests finishing while others run,
    not a second turn); the router bug's real run is in docs/zoo.md."""
    from bench.zoo import TRUTH
    from workbench.investigate import reproduce
    from workbench.investigate.investigation import localize_flagged

    rep = reproduce(["token_handoff_after_finish"], shape="baseline", turns=1, max_bursts=2,
                    judge=0, capture_dir=tmp_path / "captures", log_dir=tmp_path / "logs")
    assert rep.flagged, rep.bursts
    diag = diagnose(rep, localize_flagged(rep))
    assert diag.stage in TRUTH["token_handoff_after_finish"], diag
    assert diag.basis == "tokens" and "wrong request" in diag.detail
