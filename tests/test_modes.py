"""Engine modes and the sweep's design: cells, alignment padding, the coverage table."""

from __future__ import annotations

import polars as pl
import pytest

from workbench.drive import MODE_ORDER, MODES, cell_of, plan, with_modes
from workbench.drive.align import pad_to_boundary, prompt_length
from workbench.drive.load import session_transcript
from workbench.investigate.bursts import BURST_COLUMNS, Reproduction
from workbench.investigate.coverage import coverage_table, render, resolution
from workbench.investigate.reproduce import Sweep


def test_plan_runs_shapes_then_every_single_mode_then_pairs_of_different_axes():
    cells = plan(["baseline", "kills"], seed=3)
    names = [c.name for c in cells]
    assert names[:2] == ["baseline", "kills"]
    assert names[2:2 + len(MODE_ORDER)] == [f"baseline+{m}" for m in MODE_ORDER]
    pairs = [c for c in cells[2 + len(MODE_ORDER):]]
    assert pairs and all(len(c.modes) == 2 for c in pairs)
    assert all(MODES.get(a).axis is not MODES.get(b).axis for a, b in (c.modes for c in pairs))
    assert len(set(names)) == len(names)
    assert [c.name for c in plan(["baseline", "kills"], seed=3)] == names  # seeded
    assert [c.name for c in plan(["baseline"], seed=4)] != [c.name for c in plan(["baseline"])]
    assert [c.name for c in plan(["baseline"], (), pairs=True)] == ["baseline"]


def test_a_cell_carries_its_modes_settings_and_resolves_by_name():
    cell = with_modes("baseline", ["overlap", "chunk_64", "chunk_aligned"])
    assert cell.name == "baseline+overlap+chunk_64+chunk_aligned"
    assert cell.patches == ("overlap_schedule",) and cell.engine["chunk_size"] == 64
    assert cell.align_to == 64  # aligned to the cell's own chunk size
    assert cell.engine["hicache"] is True  # the shape's settings stay
    assert cell_of(cell.name) == cell
    assert with_modes("baseline", ["page_32", "page_aligned"]).align_to == 32
    with pytest.raises(ValueError, match="share an axis"):
        with_modes("baseline", ["page_aligned", "chunk_aligned"])
    with pytest.raises(KeyError, match="valid: .*overlap"):
        cell_of("baseline+warp_drive")


@pytest.mark.parametrize("align", [16, 64, 256])
def test_padding_ends_every_prompt_on_the_boundary_and_keeps_the_history(align):
    tr = session_transcript(0, 1)
    tools = [t.to_openai() for t in tr.tools]
    messages = tr.messages()[:1] + [{"role": "user", "content": tr.rounds[0].ask}]
    before = prompt_length(messages, tools)
    added = pad_to_boundary(messages, tools, align)
    assert prompt_length(messages, tools) % align == 0
    assert added == prompt_length(messages, tools) - before < align
    assert pad_to_boundary(messages, tools, align) == 0  # already aligned
    assert pad_to_boundary(messages, tools, 1024, limit=900) == 0  # would exceed the limit


def _rep(shape: str, requests: int, flagged: int, rooms: int) -> Reproduction:
    row = dict.fromkeys(BURST_COLUMNS, 0) | {"requests": requests, "flagged": flagged,
                                              "judged_rooms": rooms, "t_s": 1.0}
    return Reproduction(shape, (), (0,), pl.DataFrame([row], schema=BURST_COLUMNS),
                        pl.DataFrame(), (), 1.0, None, {}, {}, shape=shape)


def test_coverage_lists_every_planned_cell_with_what_it_judged():
    planned = ("baseline", "baseline+overlap", "baseline+chunk_aligned")
    sw = Sweep(planned[:2], (_rep("baseline", 20, 0, 2), _rep("baseline+overlap", 18, 3, 2)),
               "baseline+overlap", 50.0, (0.0, 25.0), planned)
    table = coverage_table(sw)
    assert table["status"].to_list() == ["clean", "fired", "not run"]
    assert table["responses"].to_list() == [20, 18, 0]
    assert table["modes"].to_list() == ["-", "overlap", "chunk_aligned"]
    assert sw.not_run == ("baseline+chunk_aligned",)
    res = resolution(sw, None)
    assert (res.responses, res.judged_rooms) == (38, 4)
    assert "every room" in res.describe()
    assert "not run" in render(table)
