"""What notebook 01's reproduction of the index-K race supports, as ``FindingDraft``s: the
buggy variants leak DSML and the race fired (``leak_findings``), the fixed ones replaying the
same seeds never corrupt (``control_findings``), SGLang's fail-closed parser drops what
``strict`` leaks (``parser_findings``), and the parser decides the symptom of the same tokens
(``symptom_findings``). Every check is computed here from ``Reproduction`` results."""

from __future__ import annotations

import polars as pl

from engine.text.tokenizer import FC_OPEN
from workbench.investigate.bursts import Reproduction
from workbench.investigate.reproduce import rates_table
from workbench.investigate.steps import first_flags
from workbench.judge import FindingDraft
from workbench.judge.symptoms import symptoms

SYMPTOM_COLUMNS = ("leaked", "dropped", "mismatched", "flagged", "requests")


def _rates(rep: Reproduction) -> dict:
    return rates_table([rep]).row(0, named=True)


def _holding_opener(rows: pl.DataFrame) -> int:
    return int(rows["content"].str.contains(FC_OPEN, literal=True).sum())


def leak_findings(buggy: Reproduction) -> list[FindingDraft]:
    """DSML leaked, every leak flagged, a session's first leak is a reference mismatch (not a
    parser bug), and the indexer read (and the sender shipped) index-K still loading."""
    b = _rates(buggy)
    first_leaks = first_flags(buggy).filter(pl.col("v_leaked"))
    return [FindingDraft(
        "the buggy variants leak DSML into content; the race really fired",
        {"DSML leaked": b["leaked"] > 0, "every leak is flagged": b["flagged"] >= b["leaked"],
         "every first-flag leak is a reference mismatch":
             not first_leaks["v_ref_match"].any(),
         "stale index-K reads": b["stale_reads"] > 0, "stale index-K sends": b["stale_sends"] > 0},
        b)]


def control_findings(fixed: Reproduction, buggy: Reproduction) -> list[FindingDraft]:
    """Over at least the buggy run's load (its seeds), the fixed variants flag nothing and
    never race."""
    f, b = _rates(fixed), _rates(buggy)
    return [FindingDraft(
        "over the same seeded load the fixed variants never corrupt, never race",
        {"no flags": f["flagged"] == 0, "no leaks": f["leaked"] == 0,
         "at least the buggy run's load": f["requests"] >= b["requests"],
         "no stale reads or sends": f["stale_reads"] == 0 and f["stale_sends"] == 0}, f)]


def parser_findings(sglang: Reproduction, strict: Reproduction) -> list[FindingDraft]:
    """Under SGLang's parser the race still corrupts output, but no response holds a block
    opener; the evidence sets the symptoms beside ``strict``'s."""
    s, b = _rates(sglang), _rates(strict)
    judged = sglang.requests.filter(pl.col("v_leaked").is_not_null())
    leaks = strict.requests.filter(pl.col("v_leaked"))
    counts = {name: {c: r[c] for c in SYMPTOM_COLUMNS} for name, r in (("strict", b),
                                                                         ("sglang", s))}
    return [FindingDraft(
        "under SGLang's fail-closed parser the same corruption is dropped, not leaked",
        {"the race corrupts output under the sglang parser too": s["flagged"] > 0,
         "the race fired": s["stale_sends"] > 0,
         "no sglang response holds a block opener": _holding_opener(judged) == 0},
        {"symptoms": counts,
         "strict leaks holding a block opener": _holding_opener(leaks)})]


def symptom_table(buggy: Reproduction) -> pl.DataFrame:
    """Each session's first leaked turn, parsed again under every parser (``symptoms``)."""
    return symptoms(first_flags(buggy).filter(pl.col("v_leaked")))


def symptom_findings(buggy: Reproduction) -> list[FindingDraft]:
    """The same corrupted tokens: ``strict`` leaks every one, streamed SGLang 0.5.23 never shows
    raw DSML, and the symptom differs between parsers."""
    seen = symptom_table(buggy)
    shown = seen.select(seen.columns[4:])
    return [FindingDraft(
        "the parser decides the symptom of the same corrupted tokens",
        {"corrupted turns to compare": len(seen) > 0,
         "strict leaks every one": bool((seen["strict"] == "leaked").all()),
         "streamed, SGLang 0.5.23 never shows raw DSML":
             not (seen["sglang_stream"] == "leaked").any(),
         "the symptom differs between parsers":
             any(len(set(row)) > 1 for row in shown.iter_rows())},
        {"symptoms": {c: seen[c].value_counts().sort(c).rows() for c in shown.columns},
         "turns": len(seen)})]
