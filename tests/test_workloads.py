"""Shipped data: named workloads (``data/workloads``) and the agentic tool pool (``data/tools``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.registry import UnknownVariantError
from engine.training.datagen import POOL, TOOLS_FILE, ToolPool, make_transcript
from workbench.cli import build_parser, load_kwargs
from workbench.drive.workloads import (
    RUN_FIELDS,
    WORKLOADS_DIR,
    list_workloads,
    load_workload,
    workload_names,
)

DATA = Path(__file__).resolve().parent.parent / "data"


def test_every_shipped_workload_loads_and_describes_itself():
    names = workload_names()
    assert {"agentic_64", "race_burst", "kill_storm", "smoke"} <= set(names)
    table = list_workloads()
    assert table["name"].to_list() == names
    assert table.filter(table["description"] == "").height == 0
    storm = load_workload("kill_storm")
    assert storm.load.kill_fraction > 0 and set(storm.kwargs()) == set(RUN_FIELDS)
    assert load_workload("agentic_64").load.sessions >= 60  # the production report's scale


def test_unknown_workloads_and_keys_are_clear_errors(tmp_path):
    with pytest.raises(UnknownVariantError, match="unknown workload 'nope'; shipped: agentic_64"):
        load_workload("nope")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"sessions": 2, "concurrency": 9}))
    with pytest.raises(ValueError, match=r"unknown workload keys \['concurrency'\]; valid: "):
        load_workload(bad)
    bad.write_text(json.dumps({"sessions": 0}))
    with pytest.raises(ValueError, match="sessions >= 1"):
        load_workload(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="a workload is a JSON object"):
        load_workload(bad)


def test_a_workload_file_outside_the_shipped_set_loads_by_path(tmp_path):
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"description": "d", "sessions": 3, "kill_fraction": 0.25}))
    w = load_workload(mine)
    assert (w.name, w.load.sessions, w.load.kill_fraction, w.load.turns) == ("mine", 3, 0.25, 2)


def test_wb_load_takes_the_workload_then_the_flags_given():
    parse = build_parser().parse_args
    a = load_kwargs(parse(["load", "--url", "u", "--workload", "race_burst", "--seed", "7"]))
    assert a == {**load_workload("race_burst").kwargs(), "seed": 7}
    b = load_kwargs(parse(["load", "--url", "u", "--sessions", "3"]))
    assert b["sessions"] == 3 and b["turns"] == 2 and b["kill_fraction"] == 0.0


def test_the_shipped_openai_schemas_are_the_pool_s_tools():
    shipped = json.loads((DATA / "tools" / "openai_schemas.json").read_text())
    assert shipped == [t.spec().to_openai() for t in POOL.tools.values()]
    assert TOOLS_FILE.parent == DATA / "tools" and WORKLOADS_DIR == DATA / "workloads"
    tr = make_transcript(0)
    assert {t.name for t in tr.tools} <= set(POOL.tools)


def test_the_tool_pool_rejects_unknown_kinds_and_asks_naming_missing_params(tmp_path):
    raw = json.loads(TOOLS_FILE.read_text())
    raw["tools"][0]["params"][0]["kind"] = "planet"
    path = tmp_path / "pool.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=r"unknown param kinds \['planet'\]"):
        ToolPool.load(path)
    raw = json.loads(TOOLS_FILE.read_text())
    raw["tools"][0]["asks"] = ["Weather on {planet}?"]
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="names 'planet'"):
        ToolPool.load(path)
