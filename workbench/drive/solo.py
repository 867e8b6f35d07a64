"""Solo reference: an oracle for engines we cannot recompute in-process (vLLM, a GPU cluster).

Every distinct prompt of a load is run again alone (concurrency 1, greedy, the same body) on the
same deployment, ``repeats`` times. The repeats measure the deployment's own nondeterminism at
concurrency 1 (the baseline, with its Wilson interval); each completed response under load is
then compared with the prompt's first solo run, token by token where token ids came back (text and
tool calls otherwise). Corruption is reported only when the mismatch rate under load lies beyond
the baseline: the load's Wilson lower bound above the baseline's upper bound.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx
import polars as pl

from workbench.deploy import EngineDown, PDPair, client_headers, lasting
from workbench.drive.concurrency import LoadResult, wilson
from workbench.drive.load import LoadConfig, chat_body
from workbench.judge.oracle import first_difference
from workbench.scale.progress import Progress


@dataclass(frozen=True)
class SoloRun:
    """One response, reduced to what is compared: token ids when returned, else the text."""

    token_ids: tuple[int, ...] | None
    text: str

    def same_as(self, other: SoloRun) -> tuple[bool, int | None]:
        if self.token_ids is not None and other.token_ids is not None:
            diff = first_difference(list(self.token_ids), list(other.token_ids))
            return diff is None, diff
        return self.text == other.text, None


@dataclass(frozen=True)
class SoloReport:
    """Baseline (solo repeats that differ from the first solo run) and load (responses under load
    that differ from it), each with a 95% Wilson interval; ``requests`` has one row per judged
    load request (``solo_match``, ``solo_first_diff``)."""

    prompts: int
    baseline_runs: int
    baseline_mismatches: int
    baseline_ci: tuple[float, float]
    judged: int
    mismatches: int
    mismatch_ci: tuple[float, float]
    requests: pl.DataFrame
    failed: int = 0  # solo requests that got no answer (their prompts are not judged)
    errors: tuple[str, ...] = ()  # the first distinct errors of those
    down: tuple[EngineDown, ...] = ()  # the deployment's deaths and hangs; solo runs stop at one

    @property
    def beyond_baseline(self) -> bool:
        """True when load mismatches exceed nondeterminism at concurrency 1 (95% intervals)."""
        return self.judged > 0 and self.mismatch_ci[0] > self.baseline_ci[1]


def _text(content: str | None, calls: list[dict]) -> str:
    return (content or "") + json.dumps(calls, sort_keys=True)


def run_alone(client: httpx.Client, url: str, body: dict) -> SoloRun:
    """One non-streaming request; raises ``httpx.HTTPStatusError`` on a non-200 answer."""
    r = client.post(url + "/v1/chat/completions", json={**body, "stream": False})
    r.raise_for_status()
    choice = r.json()["choices"][0]
    msg = choice["message"]
    calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
             for c in msg.get("tool_calls") or []]
    ids = choice.get("token_ids")
    return SoloRun(tuple(ids) if ids is not None else None, _text(msg.get("content"), calls))


def _of_row(row: dict) -> SoloRun:
    ids = json.loads(row["token_ids"]) if row.get("token_ids") else None
    return SoloRun(tuple(ids) if ids is not None else None,
                   _text(row["content"], json.loads(row["tool_calls"])))


def solo_reference(target: PDPair | str, load: LoadResult, repeats: int = 2,
                   timeout_s: float = 120.0, progress: bool = True) -> SoloReport:
    """Judges ``load``'s completed responses against solo runs on the same deployment."""
    if repeats < 2:
        raise ValueError("repeats must be >= 2 (the baseline compares solo runs with each other)")
    cfg = load.config or LoadConfig()
    url = target.url if isinstance(target, PDPair) else str(target).rstrip("/")
    done = load.requests.filter(pl.col("v_leaked").is_not_null())
    keys = sorted({(r["messages"], r["tools"], r["session"]) for r in done.iter_rows(named=True)})
    bar = Progress(len(keys) * repeats, "solo reference", enabled=progress)
    solo, errors = _solo_runs(target, url, cfg, keys, repeats, timeout_s, bar)
    bar.close()
    solo = {k: runs for k, runs in solo.items() if len(runs) == repeats}
    down = target.down() if isinstance(target, PDPair) else ()
    base_n = base_k = 0
    for runs in solo.values():
        for run in runs[1:]:
            base_n += 1
            base_k += not run.same_as(runs[0])[0]
    rows = []
    for row in done.iter_rows(named=True):
        if (row["messages"], row["tools"]) not in solo:
            continue
        same, diff = _of_row(row).same_as(solo[row["messages"], row["tools"]][0])
        rows.append({"session": row["session"], "turn": row["turn"], "kind": row["kind"],
                     "solo_match": same, "solo_first_diff": diff})
    df = pl.DataFrame(rows, schema={"session": pl.Int64, "turn": pl.Int64, "kind": pl.Utf8,
                                    "solo_match": pl.Boolean, "solo_first_diff": pl.Int64})
    k = int((~df["solo_match"]).sum()) if len(df) else 0
    return SoloReport(len(solo), base_n, base_k, wilson(base_k, base_n), len(df), k,
                      wilson(k, len(df)), df, len(errors), tuple(dict.fromkeys(errors))[:5], down)


def _solo_runs(target, url: str, cfg: LoadConfig, keys: list, repeats: int, timeout_s: float,
               bar: Progress) -> tuple[dict, list[str]]:
    """Runs every prompt ``repeats`` times alone; a failed request is an error, not a raise, and
    the runs stop once the deployment's watch sees a process die or hang."""
    solo: dict[tuple[str, str], list[SoloRun]] = {}
    errors: list[str] = []
    with httpx.Client(timeout=timeout_s, headers=client_headers(target)) as client:
        for messages, tools, session in keys:
            if isinstance(target, PDPair) and lasting(target.down()):
                break
            body = chat_body(cfg, json.loads(messages), json.loads(tools), session, stream=False)
            runs = solo.setdefault((messages, tools), [])
            for _ in range(repeats):
                try:
                    runs.append(run_alone(client, url, body))
                except (httpx.HTTPError, KeyError, ValueError) as exc:
                    errors.append(f"{type(exc).__name__}: {exc}"[:200])
                    break
                bar.update(sum(map(len, solo.values())), len(errors))
    return solo, errors
