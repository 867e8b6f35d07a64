"""Typed seams between modules: inbox messages, NIXL tags, dump keys, capture names, patch-series
labels, stop conditions, bounded tables, attaching to a running deployment."""

from __future__ import annotations

import pytest

from engine.core import SamplingParams, Sequence
from engine.core.dump import DUMP_META, BoundedMap, DumpKey
from engine.disagg.messages import Tag, TagKind
from workbench import PatchSeries, StopOn, attach
from workbench.deploy.process import LaunchError, free_port
from workbench.investigate import reproduce
from workbench.observe.buffers import capture_name


def test_tags_round_trip_and_reject_garbage():
    tags = [Tag(7, TagKind.LAYER, 0), Tag(7, TagKind.LAYER, 12), Tag(2**63 - 1, TagKind.AUX),
            Tag(1, TagKind.DONE), Tag(1, TagKind.FAILED)]
    for t in tags:
        assert Tag.parse(t.encode()) == t
    assert Tag(3, TagKind.LAYER, 4).encode() == b"3:L4" and Tag(3, TagKind.AUX).label == "aux"
    for raw in (b"", b"7", b"x:L1", b"7:L", b"7:Lx", b"7:bogus", b"7:", b"\xff:aux"):
        assert Tag.parse(raw) is None, raw
    with pytest.raises(ValueError):
        Tag(1, TagKind.LAYER)
    with pytest.raises(ValueError):
        Tag(1, TagKind.DONE, 3)


def test_dump_keys_round_trip_and_order_by_layer():
    keys = [DumpKey(10, "k"), DumpKey(2, "index_k_f32"), DumpKey(2, "v")]
    assert [DumpKey.parse(str(k)) for k in keys] == keys
    assert str(DumpKey(3, "index_k_scale")) == "layer3.index_k_scale"
    assert sorted(keys)[0] == DumpKey(2, "index_k_f32") and sorted(keys)[-1].layer == 10
    assert all(DumpKey.parse(m) is None for m in DUMP_META)
    assert DumpKey.parse("layerx.k") is None and DumpKey.parse("layer1") is None


def test_engine_inbox_takes_only_typed_messages(make_engine):
    eng = make_engine()
    with pytest.raises(TypeError, match="not an inbox message"):
        eng._post(("abort", "r1"))  # the old tuple format is refused, never read as an abort
    seq = eng.submit(Sequence("r1", [1, 2, 3, 4, 5], SamplingParams(max_tokens=3)))
    seen = []
    eng.call_soon(lambda: seen.append(len(eng.scheduler.waiting)))
    eng.run_until_idle()
    assert seen == [1] and len(seq.output) == 3


def test_bounded_map_keeps_the_most_recent_keys():
    m: BoundedMap[int, str] = BoundedMap(3)
    for i in range(10):
        m[i] = f"r{i}"
    m[7] = "again"  # re-set moves 7 to the newest end
    m[10] = "r10"
    assert len(m) == 3 and m.get(7) == "again" and m.get(9) == "r9" and m.get(8) is None
    with pytest.raises(ValueError):
        BoundedMap(0)


def test_patch_series_labels_are_looked_up_not_parsed():
    ps = PatchSeries(("a", "b_c", "d"))
    assert ps.labels() == ["base", "+a", "+a+b_c", "+a+b_c+d"]
    assert ps.patches_of("+a+b_c") == ("a", "b_c") and ps.patches_of("base") == ()
    assert ps.added_by("+a+b_c+d") == "d" and ps.added_by("base") is None
    with pytest.raises(ValueError, match="not a candidate"):
        ps.patches_of("+b_c")
    with pytest.raises(ValueError, match="once"):
        PatchSeries(("a", "a"))


def test_capture_names_and_stop_conditions_are_checked():
    assert capture_name(12, "prefill") == "room-12-prefill.safetensors"
    with pytest.raises(ValueError, match="valid: decode, prefill"):
        capture_name(12, "router")
    assert StopOn("leaked") is StopOn.LEAKED
    with pytest.raises(ValueError, match="stop_on must be one of"):
        reproduce((), stop_on="crashed")  # refused before anything is launched


def test_attach_refuses_bad_urls_and_silent_deployments():
    with pytest.raises(ValueError, match="http://HOST:PORT"):
        attach("127.0.0.1:8000")
    with pytest.raises(LaunchError, match="not healthy"):
        attach(f"http://127.0.0.1:{free_port()}", timeout_s=1.0)


def test_free_port_never_hands_out_a_port_twice():
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
