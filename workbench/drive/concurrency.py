"""``inject_concurrency``: the notebook-facing load probe, with capture-on-failure."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import polars as pl

from workbench.deploy import Capability, EngineDown, PDPair, client_headers, require
from workbench.deploy.routers import ROUTERS
from workbench.drive.load import LoadConfig, RequestRecord, SessionRunner, chat_body
from workbench.drive.seeded import check_seeded
from workbench.judge import ReferenceOracle
from workbench.judge.features import ORACLES
from workbench.observe.buffers import capture_name
from workbench.scale.progress import Progress

log = logging.getLogger(__name__)
SCHEMA = {"room": pl.Int64, "status": pl.Int64, "ttft_s": pl.Float64, "itl_s": pl.Float64,
          "e2e_s": pl.Float64, "finish_reason": pl.Utf8, "dsml_leaked": pl.Boolean,
          "v_leaked": pl.Boolean, "v_dropped": pl.Boolean, "v_well_formed": pl.Boolean,
          "v_tool_ok": pl.Boolean, "v_args_ok": pl.Boolean, "v_ref_match": pl.Boolean,
          "v_first_diff": pl.Int64, "v_oracle_error": pl.Utf8, "v_aborted": pl.Boolean,
          "v_logprob_drift": pl.Boolean, "v_logprob_drift_max": pl.Float64,
          "prompt_tokens": pl.Int64, "prompt_hash": pl.Utf8, "features": pl.Utf8,
          **{f"v_{name}_ok": pl.Boolean for name in ORACLES}}


@dataclass(frozen=True)
class LoadSummary:
    requests: int
    completed: int
    killed: int
    errors: int
    flagged: int
    leaked: int
    ref_mismatch: int
    dropped: int
    aborted: int
    corrupt_leaks: int
    flag_rate: float
    flag_rate_ci: tuple[float, float]
    median_ttft_s: float | None
    median_e2e_s: float | None
    wall_s: float
    drifted: int = 0  # responses whose logprobs drifted past the oracle's tolerance
    max_drift: float | None = None  # the largest logprob drift of any judged response


@dataclass(frozen=True)
class LoadResult:
    """Per-request DataFrame plus summary; ``captures`` lists dump files of flagged rooms and of
    rooms whose request failed without being killed (for their identities)."""

    requests: pl.DataFrame
    summary: LoadSummary
    captures: tuple[Path, ...]
    config: LoadConfig | None = None  # what was sent (max_tokens, model, seed) for replays
    down: tuple[EngineDown, ...] = ()  # deaths and hangs of the deployment up to the load's end


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval ``(lo, hi)`` for ``k`` successes in ``n`` trials.

    Invariants (exact, not up to rounding): ``0 <= lo <= k/n <= hi <= 1``; ``lo == 0.0`` when
    ``k == 0`` and ``hi == 1.0`` when ``k == n`` (the float formula leaves ~1e-17 there, which
    an error bar reads as a negative length); ``(0.0, 1.0)`` when ``n == 0``. ValueError unless
    ``0 <= k <= n``."""
    if not 0 <= k <= max(n, 0):
        raise ValueError(f"wilson needs 0 <= k <= n, got k={k} n={n}")
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    lo = 0.0 if k == 0 else min(p, max(0.0, centre - half))
    hi = 1.0 if k == n else max(p, min(1.0, centre + half))
    return (lo, hi)


def summarize(df: pl.DataFrame, wall_s: float) -> LoadSummary:
    done = df.filter(pl.col("v_leaked").is_not_null()) if len(df) else df
    flagged = int(done["flagged"].sum()) if len(done) else 0

    def med(col: str) -> float | None:
        s = done[col].drop_nulls() if len(done) else None
        return float(s.median()) if s is not None and len(s) else None
    return LoadSummary(
        requests=len(df), completed=len(done), killed=int(df["killed"].sum()) if len(df) else 0,
        errors=int((df["error"] != "").sum()) if len(df) else 0, flagged=flagged,
        leaked=int(done["v_leaked"].sum()) if len(done) else 0,
        ref_mismatch=int((done["v_ref_match"] == False).sum()) if len(done) else 0,  # noqa: E712
        dropped=int(done["v_dropped"].sum()) if len(done) else 0,
        aborted=int(done["v_aborted"].sum()) if len(done) else 0,
        corrupt_leaks=int(done["corrupt_leak"].sum()) if len(done) else 0,
        flag_rate=flagged / len(done) if len(done) else 0.0,
        flag_rate_ci=wilson(flagged, len(done)), median_ttft_s=med("ttft_s"),
        median_e2e_s=med("e2e_s"), wall_s=round(wall_s, 2),
        drifted=int(done["v_logprob_drift"].fill_null(False).sum()) if len(done) else 0,
        max_drift=_max(done["v_logprob_drift_max"]) if len(done) else None)


def _max(col: pl.Series) -> float | None:
    vals = col.drop_nulls()
    return float(vals.max()) if len(vals) else None


def oracle_for(target) -> ReferenceOracle | None:
    """An in-process reference matching the target's storage dtypes, for PDPair targets whose
    backend has one (``Capability.REFERENCE``); None otherwise (``workbench.drive.solo`` judges the
    others against themselves)."""
    if isinstance(target, PDPair) and Capability.REFERENCE in target.backend.capabilities:
        return ReferenceOracle(target.spec.engine_config())
    return None


async def _capture(pair: PDPair, rec: RequestRecord, out: Path) -> list[Path]:
    files = []
    for role, srv in (("decode", pair.decode[0]), ("prefill", pair.prefill[0])):
        try:
            blob = await asyncio.to_thread(pair.debug_bytes, "/debug/dump", srv, room=rec.room)
        except httpx.HTTPError as exc:
            log.warning("capture of room %s on %s failed: %s", rec.room, role, exc)
            continue
        path = out / capture_name(rec.room, role)
        path.write_bytes(blob)
        files.append(path)
    return files


async def _run(target, cfg: LoadConfig, oracle, progress: Progress, capture_dir: Path | None):
    url = target.url if isinstance(target, PDPair) else str(target).rstrip("/")
    records: list[RequestRecord] = []
    captures: list[asyncio.Task] = []
    deadline = time.monotonic() + cfg.duration_s

    def sink(rec: RequestRecord) -> None:
        records.append(rec)
        odd = (rec.verdict and rec.verdict.flagged) or (rec.error and not rec.killed)
        if odd and capture_dir and isinstance(target, PDPair) and rec.room is not None \
                and Capability.BUFFER_DUMPS in target.backend.capabilities:
            captures.append(asyncio.ensure_future(_capture(target, rec, capture_dir)))
        progress.update(len(records), sum(bool(r.verdict and r.verdict.flagged) for r in records))

    limits = httpx.Limits(max_connections=cfg.sessions + 8)
    timeout = httpx.Timeout(cfg.request_timeout_s)
    async with httpx.AsyncClient(limits=limits, timeout=timeout,
                                 headers=client_headers(target)) as client:
        runners = [SessionRunner(cfg, url, s, oracle, deadline, sink) for s in range(cfg.sessions)]
        await asyncio.gather(*(r.run(client) for r in runners))
        await check_seeded(client, url, lambda r: chat_body(cfg, r.messages, r.tools, r.session,
                                                            params=r.params), records)
    files = [f for fs in await asyncio.gather(*captures) for f in fs]
    return records, files


def inject_concurrency(target, sessions: int = LoadConfig.sessions,
                       turns: int = LoadConfig.turns,
                       kill_fraction: float = LoadConfig.kill_fraction,
                       duration_s: float = LoadConfig.duration_s, seed: int = LoadConfig.seed,
                       max_tokens: int = LoadConfig.max_tokens,
                       kill_window_s: float = LoadConfig.kill_window_s,
                       oracle: ReferenceOracle | None | bool = True,
                       capture_dir: str | Path | None = None, progress: bool = True,
                       request_timeout_s: float = LoadConfig.request_timeout_s,
                       align_to: int | None = None,
                       dialect: str = LoadConfig.dialect) -> LoadResult:
    """Runs ``sessions`` concurrent agentic sessions against ``target`` and judges each response.

    ``target``: a ``PDPair`` or any OpenAI-compatible base URL. ``oracle=True`` builds the
    single-request reference for PDPair targets (token-identical check); pass False to skip.
    Flagged requests have their buffers dumped into ``capture_dir`` (PDPair targets); a request
    not answered within ``request_timeout_s`` fails as an error (a wedge shows this way).
    ``align_to``: pad every prompt to end on a multiple of that many tokens
    (``workbench.drive.align``). ``dialect``: how each request calls the API
    (``workbench.drive.dialects``: ``greedy``, ``agentic``, ``clients``); its features' oracles
    judge each response (``workbench.judge.features``), sampled ones replayed alone after the
    burst (``workbench.drive.seeded``).
    """
    if capture_dir and isinstance(target, PDPair):
        require(target, Capability.BUFFER_DUMPS, "inject_concurrency(capture_dir=...)")
    ref = oracle_for(target) if oracle is True else (oracle or None)
    cfg = LoadConfig(sessions, turns, kill_fraction, duration_s, seed, max_tokens,
                     request_timeout_s=request_timeout_s, kill_window_s=kill_window_s,
                     logprobs=_needs_logprobs(target) or ref is not None,
                     model=target.model if isinstance(target, PDPair) else None,
                     align_to=align_to, dialect=dialect)
    out = Path(capture_dir) if capture_dir else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    bar = Progress(sessions * turns * 2, f"load seed={seed}", enabled=progress)
    t0 = time.monotonic()
    records, files = run_sync(_run(target, cfg, ref, bar, out))
    bar.close()
    down = mark_down(target, records)
    result = load_result(records, time.monotonic() - t0, tuple(files), cfg)
    return dataclasses.replace(result, down=down)


def mark_down(target, records: list[RequestRecord]) -> tuple[EngineDown, ...]:
    """Lines the load's requests up with what the deployment's watch saw: each observation gets
    the number of requests in flight at its time, and each request that ended after it without
    an answer names it in ``engine_down``. Returns the observations (empty: none, or no watch)."""
    watch = target.watch if isinstance(target, PDPair) else None
    if watch is None or not watch.down():
        return ()

    def open_at(t: float) -> int:
        return sum(r.started_at is not None and r.started_at <= t <= (r.ended_at or t)
                   for r in records)  # open at t
    starts = [r.started_at for r in records if r.started_at is not None]
    down = watch.mark_in_flight(open_at, min(starts, default=time.time()))
    for rec in records:
        failed = not rec.killed and (rec.status != 200 or bool(rec.error))
        hit = [o for o in down if failed and (rec.ended_at or 0.0) >= o.since]
        rec.engine_down = "; ".join(o.describe() for o in hit)
    return down


def load_result(records: list[RequestRecord], wall_s: float, captures: tuple[Path, ...] = (),
                cfg: LoadConfig | None = None) -> LoadResult:
    """The ``LoadResult`` of judged records (a real load's or a simulated one's)."""
    df = pl.DataFrame([r.row() for r in records], schema_overrides=SCHEMA,
                      infer_schema_length=None)
    if len(df):
        df = df.sort(["session", "turn", "kind"])
    return LoadResult(df, summarize(df, wall_s), captures, cfg)


def _needs_logprobs(target) -> bool:
    """Token ids come back as ``token_ids`` through our router when we launched it; through
    others (an attached deployment, a bare URL) they are recovered from ``logprobs``."""
    if not isinstance(target, PDPair) or target.router.proc is None:
        return True
    if target.backend.name != "embedded":  # vLLM and vllm-router pass return_token_ids on
        return Capability.TOKEN_IDS not in target.backend.capabilities
    return not ROUTERS.get(target.spec.router).forwards_token_ids


def run_sync(coro):
    """Runs a coroutine from sync code, also inside Jupyter's already-running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()

