"""Traffic files: a workload as the requests themselves, so a burst found here replays anywhere.

A ``Traffic`` is what a client sent: each ``TrafficRequest`` holds the chat request body as
sent, its arrival offset from the trace's start and, for a request the client abandoned, how
long after sending it disconnected. The file is JSON lines, one request per line
(``write``/``read``: the one definition of the format). ``traffic_of(load)`` turns any load the
workbench ran into one; ``play(target, traffic)`` sends it open loop (each request at its
offset, bodies as recorded) and judges every answer with the same oracles as a load (no
transcript is owed: a replayed request is judged against the reference of its own prompt).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import polars as pl

from workbench.deploy import PDPair, client_headers
from workbench.drive.concurrency import LoadResult, load_result, oracle_for, run_sync
from workbench.drive.dialects import RequestParams
from workbench.drive.load import LoadConfig, chat_body, send_judged
from workbench.drive.record import RequestRecord
from workbench.judge import ReferenceOracle

SUFFIX = ".traffic.jsonl"


def traffic_name(shape: str, seed: int) -> str:
    """The file a burst of ``shape`` seeded ``seed`` is written to (in its captures folder)."""
    return f"burst-{shape}-seed{seed}{SUFFIX}"


@dataclass(frozen=True)
class TrafficRequest:
    """One request: ``body`` as sent, ``at_s`` after the trace's start, abandoned
    ``disconnect_s`` after it was sent (None: read to the end). ``session``/``turn``/``kind``
    say where it came from (kept for the tables; playing does not depend on them)."""

    at_s: float
    body: dict
    disconnect_s: float | None = None
    session: int = 0
    turn: int = 0
    kind: str = "answer"

    def params(self) -> RequestParams:
        """The API features of ``body`` (``RequestParams``; ValueError for a sampled request
        without a seed, which no oracle can judge)."""
        b = self.body
        choice = b.get("tool_choice")
        named = choice["function"]["name"] if isinstance(choice, dict) else \
            "required" if choice == "required" else None
        hot, stop = float(b.get("temperature") or 0.0), b.get("stop")
        return RequestParams(
            hot, b.get("top_p"), b.get("seed") if hot > 0 else None, bool(b.get("stream")),
            (stop,) if isinstance(stop, str) else tuple(stop or ()), b.get("max_tokens"), named,
            b.get("top_logprobs"),
            bool((b.get("stream_options") or {}).get("include_usage")),
            b.get("parallel_tool_calls"), bool(b.get("response_format")),
            bool(b.get("ignore_eos")))


@dataclass(frozen=True)
class Traffic:
    """Requests in arrival order. Invariant: ``at_s`` never decreases."""

    requests: tuple[TrafficRequest, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        at = [r.at_s for r in self.requests]
        if at != sorted(at):
            raise ValueError("traffic requests must be in arrival order")

    def __len__(self) -> int:
        return len(self.requests)

    def subset(self, keep) -> Traffic:
        """The requests whose index is in ``keep``, in order."""
        return Traffic(tuple(r for i, r in enumerate(self.requests) if i in set(keep)))

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(asdict(r)) + "\n" for r in self.requests))
        return path

    @classmethod
    def read(cls, path: str | Path) -> Traffic:
        """A traffic file; ValueError naming the line for one that is not a request."""
        out = []
        for n, line in enumerate(Path(path).read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
                out.append(TrafficRequest(float(raw["at_s"]), dict(raw["body"]),
                                          raw.get("disconnect_s"), int(raw.get("session", 0)),
                                          int(raw.get("turn", 0)), raw.get("kind", "answer")))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{n}: not a traffic request ({exc})") from None
        return cls(tuple(sorted(out, key=lambda r: r.at_s)))


def traffic_of(load: LoadResult) -> Traffic:
    """The requests a load sent, as a trace: bodies rebuilt as they were sent, offsets from
    its first request, kills as disconnects."""
    df, cfg = load.requests, load.config or LoadConfig()
    if not len(df):
        return Traffic()
    t0 = df["started_at"].min()
    rows = df.filter(pl.col("started_at").is_not_null()).sort("started_at")
    out = []
    for r in rows.iter_rows(named=True):
        params = RequestParams(**json.loads(r["params"])) if r.get("params") else RequestParams()
        body = chat_body(cfg, json.loads(r["messages"]), json.loads(r["tools"]), r["session"],
                         params=params)
        cut = r["ended_at"] - r["started_at"] if r["killed"] and r["ended_at"] else None
        out.append(TrafficRequest(round(r["started_at"] - t0, 4), body, cut, r["session"],
                                  r["turn"], r["kind"]))
    return Traffic(tuple(out))


async def _one(client, url: str, req: TrafficRequest, oracle, t0: float) -> RequestRecord:
    await asyncio.sleep(max(0.0, t0 + req.at_s - time.monotonic()))
    b = req.body
    rec = RequestRecord(req.session, req.turn, req.kind, messages=b["messages"],
                        tools=b.get("tools") or [],
                        max_tokens=b.get("max_tokens") or LoadConfig.max_tokens,
                        params=req.params())
    await send_judged(client, url, b, rec, oracle, req.disconnect_s, None, off_script=True)
    return rec


def play(target, traffic: Traffic, oracle: ReferenceOracle | None | bool = True,
         request_timeout_s: float = LoadConfig.request_timeout_s) -> LoadResult:
    """Sends ``traffic`` to ``target`` (a ``PDPair`` or a base URL) open loop and judges each
    answer; ``oracle=True`` builds the reference a ``PDPair`` supports (``oracle_for``)."""
    ref = oracle_for(target) if oracle is True else (oracle or None)
    url = target.url if isinstance(target, PDPair) else str(target).rstrip("/")

    async def run() -> list[RequestRecord]:
        limits = httpx.Limits(max_connections=len(traffic) + 8)
        async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(request_timeout_s),
                                     headers=client_headers(target)) as client:
            t0 = time.monotonic()
            return list(await asyncio.gather(*(_one(client, url, r, ref, t0)
                                               for r in traffic.requests)))
    t = time.monotonic()
    records = run_sync(run())
    return load_result(records, time.monotonic() - t)
