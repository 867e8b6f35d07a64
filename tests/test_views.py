"""The notebook views' data, without a browser or a server: what the explorer and the pair monitor
would draw, the font reports embed, and the static renderings an exported report keeps."""

from __future__ import annotations

import json

import nbformat
import polars as pl
import pytest

from engine.text import Tokenizer
from engine.text.tokenizer import FC_OPEN
from workbench.drive.load import RequestRecord
from workbench.drive.replay import body_of, compare
from workbench.judge.oracle import judge
from workbench.report import Explorer, ExplorerFilter, embed_fonts, explore, export_html
from workbench.report.explorer.table import Mark, detail, requests_table
from workbench.report.fonts import FULLWIDTH_BAR, covered, subset_font, vocab_chars
from workbench.report.monitor.data import embedded_sample, metrics_sample, panel, with_rate
from workbench.report.monitor.html import panel_html
from workbench.report.monitor.view import wanted_metrics
from workbench.report.static import WIDGET_VIEW, static_notebook

TOK = Tokenizer()


def _record(session: int, turn: int, served: str, reference: str, finish: str = "stop",
            lp_shift: float = 0.0) -> RequestRecord:
    ids, ref = TOK.encode(served), TOK.encode(reference)
    rec = RequestRecord(session, turn, "answer", room=100 + session, status=200,
                        finish_reason=finish, content=served, token_ids=ids,
                        logprobs=[-0.5 - lp_shift] * len(ids), max_tokens=64,
                        messages=[{"role": "user", "content": f"ask {session}"}], tools=[],
                        ref_token_ids=ref, ref_logprobs=[-0.5] * len(ref))
    rec.verdict = judge(served, [], None, None, ids, ref, finish_reason=finish,
                        logprobs=rec.logprobs, ref_logprobs=rec.ref_logprobs, tolerance=1e-6)
    return rec


@pytest.fixture(scope="module")
def frame() -> pl.DataFrame:
    recs = [_record(0, 0, "fine answer", "fine answer"),
            _record(1, 0, f"pay{FC_OPEN}x", "pay says ok"),
            _record(2, 0, "ok abc", "ok abd", finish="length"),
            _record(3, 0, "same", "same", lp_shift=0.01)]
    return pl.DataFrame([r.row() for r in recs], infer_schema_length=None)


def test_the_explorer_widget_lists_flagged_requests_and_shows_the_one_picked(frame):
    from workbench.report.explorer.widget import ExplorerWidget

    view = ExplorerWidget(Explorer(frame))
    assert view.verdict.value == "flagged" and len(view.pick.options) == 3
    assert view.button.disabled  # no replay target given
    view.pick.value = view.pick.options[0][1]
    assert "wb-first-diff" in view.pane.value
    view.session.value = "2"
    assert [v for _, v in view.pick.options] == [2]


def test_explorer_rows_carry_a_verdict_and_filter(frame):
    rows = requests_table(frame)
    assert rows["verdict"].to_list() == ["clean", "leaked", "mismatched", "drifted"]
    ex = Explorer(frame)
    assert ex.filter(ExplorerFilter(verdict="flagged"))["session"].to_list() == [1, 2, 3]
    assert ex.filter(ExplorerFilter(finish_reason="length"))["session"].to_list() == [2]
    assert ex.filter(ExplorerFilter(session=1, verdict="leaked"))["request"].to_list() == [1]
    with pytest.raises(ValueError, match="verdict must be one of"):
        ExplorerFilter(verdict="weird")
    with pytest.raises(TypeError, match="explore needs"):
        explore(42)


def test_detail_marks_the_first_differing_token_on_both_sides(frame):
    d = detail(requests_table(frame).row(1, named=True))
    assert d.first_diff == 3  # "pay" then the block opener where the reference says " "
    assert [t.mark for t in d.response[:4]] == [Mark.SAME] * 3 + [Mark.FIRST_DIFF]
    assert d.response[3].text == FC_OPEN and d.response[3].special
    assert d.reference[3].text == " " and d.reference[3].mark is Mark.FIRST_DIFF
    assert all(t.mark is Mark.AFTER for t in d.response[4:])
    assert [p.position for p in d.drift] == [0, 1, 2]  # agreeing tokens only


def test_drift_is_per_token_over_agreeing_positions(frame):
    d = detail(requests_table(frame).row(3, named=True))
    assert d.first_diff is None and len(d.drift) == len("same")
    assert all(p.drift == pytest.approx(0.01) for p in d.drift)


def test_static_explorer_shows_the_highlighted_token_verbatim_with_the_font(frame):
    page = Explorer(frame).static_html()
    assert '<span class="wb-tok wb-special wb-first-diff" id="wb-first-diff">' \
           "&lt;｜DSML｜function_calls&gt;</span>" in page
    assert "@font-face" in page and "data:image/png;base64" in page  # font, drift plot


def test_replay_compares_with_reference_and_served(frame):
    row = requests_table(frame).row(1, named=True)
    body = body_of(row)
    assert body["max_tokens"] == 64 and body["seed"] == 1 and body["stream"] is False
    assert body["messages"] == json.loads(row["messages"])
    again = compare(row, tuple(json.loads(row["token_ids"])))
    assert again.still_differs and again.first_diff == 3 and again.same_as_served
    fixed = compare(row, tuple(json.loads(row["ref_token_ids"])))
    assert fixed.still_differs is False and fixed.same_as_served is False
    assert "matches the reference alone" in fixed.describe()


def test_monitor_panel_from_samples():
    queues = {"prealloc": [1, 2], "transfer": [3], "running": [], "quarantine": [{"pages": 4}],
              "pages": {"total": 64, "free": 40, "cached": 12}}
    rooms = [{"state": "TRANSFERRING"}, {"state": "SUCCESS"}, {"state": "SUCCESS"}]
    a = embedded_sample(0.0, "decode", "d0", queues, rooms, 100.0, 0)
    b = with_rate(embedded_sample(2.0, "decode", "d0", queues, rooms, 160.0, 3), a)
    assert a.queues == {"prealloc": 2, "transfer": 1, "running": 0, "quarantine": 1}
    assert a.rooms == {"TRANSFERRING": 1, "SUCCESS": 2} and a.pages_quarantined == 4
    assert b.tokens_per_s == 30.0 and a.tokens_per_s is None
    v = metrics_sample(2.0, "prefill", "p0", {"vllm:num_requests_running": 3.0,
                                              "vllm:kv_cache_usage_perc": 0.25,
                                              "vllm:generation_tokens_total": 9.0}, 3)
    p = panel([a, b, v])
    assert p.ticks == 2 and p.flagged == 3 and set(p.roles) == {"decode", "prefill"}
    assert p.roles["decode"].queues["prealloc"] == (2, 2)
    assert p.roles["decode"].pages["free"] == (40, 40)
    assert p.roles["prefill"].latest.kv_usage == 0.25
    html = panel_html(p, live=True)
    assert 'data-ticks="2"' in html and "3 flagged so far" in html and "prealloc 2" in html


def test_monitor_reads_its_series_from_an_exposition():
    text = ("# HELP pdwb_generated_tokens_total tokens generated\n"
            "pdwb_generated_tokens_total 12.0\n"
            'vllm:num_requests_running{engine="0"} 2.0\nvllm:num_requests_running{engine="1"} 1\n'
            'pdwb_time_to_first_token_seconds_bucket{le="0.1"} 4.0\nbroken_line\n')
    assert wanted_metrics(text) == {"pdwb_generated_tokens_total": 12.0,
                                    "vllm:num_requests_running": 3.0}


def test_font_covers_every_character_the_model_emits():
    chars = vocab_chars()
    assert chr(FULLWIDTH_BAR) in chars and "▁" in chars and "a" in chars
    assert chars <= covered()


def test_fullwidth_bar_is_the_bar_centred_in_a_double_advance():
    import io

    from fontTools.ttLib import TTFont

    font = TTFont(io.BytesIO(subset_font()))
    cmap = font.getBestCmap()
    full, bar = cmap[FULLWIDTH_BAR], cmap[ord("|")]
    assert font["hmtx"][full][0] == 2 * font["hmtx"][bar][0]
    g, gb = font["glyf"][full], font["glyf"][bar]
    assert (g.xMax - g.xMin, g.yMax - g.yMin) == (gb.xMax - gb.xMin, gb.yMax - gb.yMin)
    assert abs((g.xMin + g.xMax) / 2 - font["hmtx"][full][0] / 2) <= 2


def test_export_keeps_the_static_view_and_embeds_the_font(tmp_path, frame):
    nb = nbformat.v4.new_notebook()
    static = Explorer(frame).static_html()
    view = {"version_major": 2, "version_minor": 0, "model_id": "x"}
    cell = nbformat.v4.new_code_cell("explore(x)")
    cell.outputs = [nbformat.v4.new_output("display_data", {
        WIDGET_VIEW: view, "text/html": static, "text/plain": "Explorer"}),
        nbformat.v4.new_output("display_data", {WIDGET_VIEW: view, "text/plain": "w"})]
    nb.cells = [cell]
    stripped = static_notebook(nbformat.from_dict(json.loads(json.dumps(nb))))
    assert WIDGET_VIEW not in stripped.cells[0].outputs[0]["data"]
    assert WIDGET_VIEW in stripped.cells[0].outputs[1]["data"]  # nothing static to show
    nbformat.write(nb, tmp_path / "n.ipynb")
    page = export_html(tmp_path / "n.ipynb").read_text()
    assert 'id="wb-first-diff"' in page and "--jp-code-font-family: 'WB DSML Mono'" in page
    assert embed_fonts(page) == page  # once per page
