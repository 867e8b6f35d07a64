"""One investigation of an unknown bug: sweep shapes until an anomaly, localize it, optionally
bisect commits, and say where it arises. It is never told which bug it is looking for.

``investigate(source=...)`` runs ``workbench.investigate.reproduce.sweep`` on the code in ``source``
(a checkout), localizes the first flagged rooms from their captures
(``workbench.observe.localize``), and ``diagnose`` names the component (``Stage``: router,
prefill, transfer, decode, sampling, engine loop) from the evidence, most direct first: HiCache
reads that raced their load, then rooms whose dumps carry two requests (router), then decode
positions whose layer-0 K reads back as computed from a token their request does not hold (the
engine loop fed the forward another token: ``workbench.observe.inputs``), then buffer
divergences, then generated tokens that depart from the reference's greedy choice over right
buffers or a stream that carried tokens its request did not produce (two rooms that got each
other's due token, or such a stream: engine loop; else sampling;
``workbench.observe.attribution``), then room failure reasons, then what stayed after draining,
then late writes. The diagnosis quotes the warning and error lines of the pair's logs around the
flagged requests (``workbench.observe.logs``). With ``commits=(good,
bad)`` it then bisects that range in ``source``'s repository with the shape that fired. The result
is an ``Investigation`` (``workbench.investigate.outcome``) whatever happened: an engine that did
not start, nothing found, a bug found but not localized and a bisection that did not converge are
outcomes. What was asked is one frozen ``InvestigationSpec`` (``workbench.investigate.spec``),
kept on the result.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path

import polars as pl

from workbench.deploy import LaunchError
from workbench.investigate.bursts import Reproduction
from workbench.investigate.commits import bisect_commits
from workbench.investigate.outcome import Diagnosis, Investigation, Outcome, column_total
from workbench.investigate.reproduce import Sweep, sweep
from workbench.investigate.spec import BisectSpec, InvestigationSpec
from workbench.judge.findings import tree_state
from workbench.observe import ReferenceBuffers
from workbench.observe.attribution import attribute_tokens, room_conflict, shared_rooms
from workbench.observe.buffers import capture_name, load_identity
from workbench.observe.localize import AUX_FIRST_TOKEN, Localization, Stage, localize
from workbench.observe.logs import log_evidence

log = logging.getLogger(__name__)
EXPECTED_REASONS = ("client abort", "client disconnected", "decode abort")
_TIMEOUTS = ("waiting timeout", "prefill unreachable")


def diagnose(rep: Reproduction, localizations: Sequence[Localization]) -> Diagnosis:
    """The component an anomalous reproduction points at (see the module docstring for the
    order), with the warning and error lines of the pair's logs around its flagged requests."""
    return dataclasses.replace(_diagnose(rep, localizations), logs=_log_lines(rep))


def _diagnose(rep: Reproduction, localizations: Sequence[Localization]) -> Diagnosis:
    reads = column_total(rep.bursts, "stale_reads")
    kv_reads = column_total(rep.bursts, "stale_kv_reads")
    if reads or kv_reads:
        kind = "index_k_read" if reads >= kv_reads else "kv_read"
        return Diagnosis(Stage.PREFILL, kind, f"{reads} index-K and {kv_reads} K/V reads of a "
                         "layer still loading back from HiCache", "race")
    shared = ([loc.conflict for loc in localizations if loc.conflict]
              + _failed_room_conflicts(rep) + shared_rooms(rep.requests))
    if shared:
        return Diagnosis(Stage.ROUTER, "shared_room", f"{shared[0]} ({len(shared)} room(s) "
                         "alike): the control plane gave one room to two requests", "identity")
    mixups = [m for loc in localizations for m in loc.mixups]
    if mixups:
        return Diagnosis(Stage.ENGINE_LOOP, "input_token", f"{mixups[0].describe()} "
                         f"({len(mixups)} position(s) in {len({m.room for m in mixups})} "
                         "room(s) alike)", "tokens")
    divs = sorted(loc.first for loc in localizations if loc.first is not None)
    if divs:
        kind = "aux" if divs[0].buffer == AUX_FIRST_TOKEN else divs[0].buffer
        return Diagnosis(divs[0].stage, kind, divs[0].describe(), "buffers")
    served = _served_wrong(rep, ("stop", "length", "text", "usage", "top1"))
    if served:
        return Diagnosis(Stage.SERVING, served[0], f"{served[1]}: the answer misstates the "
                         "tokens generated (their buffers agree with the reference)", "features")
    streams = [loc.stream for loc in localizations if loc.stream]
    if streams:
        return Diagnosis(Stage.ENGINE_LOOP, "stream_handoff", f"{streams[0]} ({len(streams)} "
                         "room(s) alike)", "tokens")
    tokens = attribute_tokens([loc.off_greedy for loc in localizations if loc.off_greedy])
    if tokens is not None:
        stage = Stage.ENGINE_LOOP if tokens.component == "engine_loop" else Stage.SAMPLING
        kind = "token_handoff" if stage is Stage.ENGINE_LOOP else "off_greedy"
        return Diagnosis(stage, kind, tokens.detail, "tokens")
    seeded = _served_wrong(rep, ("seed",))
    if seeded:
        return Diagnosis(Stage.SAMPLING, "seed", f"{seeded[1]}: seeded sampling gave other "
                         "tokens in the burst than alone", "features")
    expected = EXPECTED_REASONS + (_TIMEOUTS if rep.expect_aborts else ())
    odd = {r: n for r, n in rep.reasons.items() if r not in expected}
    if odd:
        reason = max(odd, key=odd.get)
        stage = Stage.TRANSFER if "aux" in reason else Stage.DECODE
        return Diagnosis(stage, "aux" if "aux" in reason else "room_failure",
                         f"{odd[reason]} rooms failed with '{reason}'", "failures")
    left = {k: v for d in rep.drains for k, v in d.left.items()}
    if left:
        key = max(left, key=left.get)
        stage = Stage.PREFILL if key.startswith("prefill:") else Stage.DECODE
        return Diagnosis(stage, key.split(":", 1)[1], f"after draining: {left}", "leftovers")
    late = column_total(rep.bursts, "late_writes")
    if late:
        return Diagnosis(Stage.DECODE, "late_writes", f"{late} writes landed in pages no live "
                         "room owned", "late_writes")
    return Diagnosis(None, "none", "no evidence beyond the responses themselves", "none")


def _served_wrong(rep: Reproduction, oracles: tuple[str, ...]) -> tuple[str, str] | None:
    """(the feature oracle that failed most, "N of M judged requests failed <oracle>") over
    ``oracles``, or None when none failed."""
    req = _right_tokens(rep.requests)
    counts = {o: (int((req[c] == False).sum()), int(req[c].is_not_null().sum()))  # noqa: E712
              for o in oracles if (c := f"v_{o}_ok") in req.columns}
    failed = {o: n for o, n in counts.items() if n[0]}
    if not failed:
        return None
    worst = max(failed, key=lambda o: failed[o][0])
    return worst, f"{failed[worst][0]} of {failed[worst][1]} judged requests failed {worst}"


def _right_tokens(req: pl.DataFrame) -> pl.DataFrame:
    """Requests whose tokens agree with the reference as far as they go (a match, no
    reference, or a prefix of it): where a feature oracle's failure is the answer's, not the
    tokens' (an engine bug that changes tokens fails those oracles too)."""
    if not len(req) or "v_ref_match" not in req.columns:
        return req
    n = req["token_ids"].map_elements(lambda t: len(json.loads(t) or []), return_dtype=pl.Int64)
    prefix = pl.col("v_first_diff").is_not_null() & (pl.col("v_first_diff") >= n)
    return req.filter(pl.col("v_ref_match").is_null() | pl.col("v_ref_match") | prefix)


def _failed_room_conflicts(rep: Reproduction, n: int = 12) -> list[str]:
    """``room_conflict`` of rooms whose request failed unkilled, from their captures'
    identities alone (their buffers are not compared: a failed room's are incomplete)."""
    if not len(rep.requests) or not rep.captures:
        return []
    failed = rep.requests.filter((pl.col("error") != "") & ~pl.col("killed")
                                 & pl.col("room").is_not_null())
    files = {p.name: p for p in rep.captures}
    out = []
    for row in failed.head(n).iter_rows(named=True):
        room = row["room"]
        pre, dec = (files.get(capture_name(room, role)) for role in ("prefill", "decode"))
        try:
            found = room_conflict(room, load_identity(pre) if pre else None,
                                  load_identity(dec) if dec else None, row.get("prompt_hash"))
        except (OSError, ValueError) as exc:
            log.warning("identity of room %d not read: %s", room, exc)
            continue
        if found:
            out.append(found)
    return out


def _log_lines(rep: Reproduction) -> tuple[str, ...]:
    """Alerting log lines naming the flagged rooms or inside their requests' time window."""
    if not rep.log_dir or not len(rep.requests):
        return ()
    bad = rep.requests.filter(pl.col("flagged") | ((pl.col("error") != "") & ~pl.col("killed")))
    if not len(bad):
        return ()
    rooms = [r for r in bad["room"].to_list() if r is not None]
    t0, t1 = bad["started_at"].min(), bad["ended_at"].max()
    window = (t0 - 1.0, t1 + 1.0) if t0 is not None and t1 is not None else None
    return tuple(ln.describe() for ln in log_evidence(rep.log_dir, rooms, window=window))


def _flagged_rooms(rep: Reproduction, n: int) -> list[tuple[int, str | None, list | None]]:
    """(room, the prompt hash the client sent, the tokens it received; None: unknown) of up to
    ``n`` flagged rooms captured on both sides."""
    if not len(rep.requests):
        return []
    bad = rep.requests.filter(pl.col("flagged") & pl.col("room").is_not_null())
    captured = {p.name for p in rep.captures}
    out = []
    for row in bad.iter_rows(named=True):
        r = row["room"]
        if capture_name(r, "prefill") in captured and capture_name(r, "decode") in captured:
            ids = json.loads(row["token_ids"]) if row.get("token_ids") else None
            out.append((r, row.get("prompt_hash"), ids))
    return out[:n]


def localize_flagged(rep: Reproduction, n: int = 12) -> list[Localization]:
    """Localizations of up to ``n`` flagged rooms captured on both sides (a room whose capture
    cannot be read is skipped and logged)."""
    out, refb = [], None
    for room, sent, received in _flagged_rooms(rep, n):
        refb = refb or ReferenceBuffers(rep.engine_config())
        try:
            out.append(localize(rep, room, refb, sent=sent, received=received))
        except (KeyError, OSError, ValueError) as exc:
            log.warning("room %d not localized: %s", room, exc)
    return out


def investigate(spec: InvestigationSpec | None = None, **fields) -> Investigation:
    """Runs ``spec`` (an ``InvestigationSpec``; ``fields`` build one, or override its fields):
    sweeps, localizes and (with ``commits="GOOD..BAD"``) bisects the code in ``spec.source``
    (default this checkout) with ``spec.patches`` enabled; writes captures and logs under
    ``spec.runs_dir``. The result keeps the spec (``Investigation.spec``).

    Never raises for an outcome: a launch that fails ends the sweep with ``LAUNCH_FAILED`` and
    the launcher's message; a bisection that fails keeps the sweep's result and its error."""
    spec = dataclasses.replace(spec, **fields) if spec else InvestigationSpec(**fields)
    t0, out = time.monotonic(), Path(spec.runs_dir)
    tree = tree_state(spec.source or ".")
    kw = {"shapes": spec.shapes} if spec.shapes else {}
    if spec.modes is not None:
        kw["modes"] = spec.modes
    try:
        sw = sweep(spec.patches, seed=spec.seed, cap_s=spec.cap_s, capture_dir=out / "captures",
                   log_dir=out / "logs", source=spec.source,
                   bursts_per_shape=spec.bursts_per_shape, pairs=spec.pairs, judge=spec.judge,
                   **kw)
    except LaunchError as exc:
        log.warning("investigation: the engine did not start: %s", exc)
        return Investigation(Sweep((), (), None, 0.0), NO_DIAGNOSIS, (), None,
                             round(time.monotonic() - t0, 2), Outcome.LAUNCH_FAILED,
                             tree=tree, error=str(exc), spec=spec)
    hit = sw.hit
    locs = _localizations(hit)
    diag = diagnose(hit, locs) if hit is not None else Diagnosis(
        None, "none", f"no anomaly in {len(sw.runs)} shapes", "none")
    bis, err = _bisect(spec, sw)
    outcome = (Outcome.NOTHING_FOUND if hit is None else Outcome.LOCALIZED
               if diag.stage is not None else Outcome.NOT_LOCALIZED)
    log.info("investigation: %s; %s", outcome.value, diag.describe())
    return Investigation(sw, diag, tuple(locs), bis, round(time.monotonic() - t0, 2), outcome,
                         tree=tree, error=err, spec=spec)


NO_DIAGNOSIS = Diagnosis(None, "none", "nothing ran", "none")


def _localizations(hit: Reproduction | None) -> list[Localization]:
    if hit is None:
        return []
    return localize_flagged(hit) + [loc for loc in hit.localizations if loc.first]


def _bisect(spec: InvestigationSpec, sw: Sweep):
    """The bisection of ``spec.commits`` with the shape that fired, or its error (never
    raised)."""
    if sw.hit is None or spec.good_bad is None:
        return None, ""
    out = Path(spec.runs_dir)
    good, bad = spec.good_bad
    try:
        return bisect_commits(BisectSpec(
            f"{good}..{bad}", spec.source or ".", sw.fired, spec.patches, spec.judge,
            spec.confidence, spec.max_trials, seed=spec.seed, store=str(out / "bisect.sqlite"),
            log_dir=str(out / "bisect-logs"))), ""
    except (LaunchError, ValueError, OSError, RuntimeError) as exc:
        log.warning("investigation: bisection failed: %s", exc)
        return None, f"bisection failed: {exc}"
