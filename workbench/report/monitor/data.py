"""What the pair monitor draws, as data: one ``RoleSample`` per server per tick, and the
``Panel`` (latest values and series per role) built from them.

Embedded pairs are read through their debug routes (queues, rooms by state, pages) and
``/metrics`` (generated tokens); a vLLM pair through the ``/metrics`` it exposes (running and
waiting requests, KV-cache usage, generation tokens). ``tokens_per_s`` is the counter's rate since
the previous sample of the same server (None on the first).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

GENERATED = ("pdwb_generated_tokens_total", "vllm:generation_tokens_total",
             "pdwb_generated_tokens", "vllm:generation_tokens")
VLLM_GAUGES = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting"}
VLLM_KV = "vllm:kv_cache_usage_perc"


@dataclass(frozen=True)
class RoleSample:
    """One server at ``t_s``: queue depths by queue, rooms by transfer state, pages (free,
    cached, quarantined; None where the backend does not say), generated tokens so far and their
    rate, and the requests flagged so far over the whole load."""

    t_s: float
    role: str
    server: str
    queues: dict[str, int] = field(default_factory=dict)
    rooms: dict[str, int] = field(default_factory=dict)
    pages_free: int | None = None
    pages_cached: int | None = None
    pages_quarantined: int | None = None
    kv_usage: float | None = None
    tokens_total: float | None = None
    tokens_per_s: float | None = None
    flagged: int = 0


def embedded_sample(t_s: float, role: str, server: str, queues: dict, rooms: list[dict],
                    tokens_total: float | None, flagged: int) -> RoleSample:
    """From our ``/debug/queues`` and ``/debug/transfers`` views of one server."""
    depths = {k: len(v) for k, v in queues.items() if isinstance(v, list)}
    pages = queues.get("pages", {})
    quarantined = sum(int(e.get("pages", 1)) if isinstance(e, dict) else 1
                      for e in queues.get("quarantine", ()))
    return RoleSample(t_s, role, server, depths, dict(Counter(r["state"] for r in rooms)),
                      pages.get("free"), pages.get("cached"),
                      quarantined if "quarantine" in queues else None,
                      tokens_total=tokens_total, flagged=flagged)


def metrics_sample(t_s: float, role: str, server: str, values: dict[str, float],
                   flagged: int) -> RoleSample:
    """From a server's ``/metrics`` alone (``values``: name -> value, summed over labels)."""
    queues = {label: int(values[name]) for name, label in VLLM_GAUGES.items() if name in values}
    tokens = next((values[n] for n in GENERATED if n in values), None)
    return RoleSample(t_s, role, server, queues, kv_usage=values.get(VLLM_KV),
                      tokens_total=tokens, flagged=flagged)


def with_rate(sample: RoleSample, prev: RoleSample | None) -> RoleSample:
    """``sample`` with ``tokens_per_s`` since ``prev`` (the same server's previous sample)."""
    from dataclasses import replace

    if (prev is None or sample.tokens_total is None or prev.tokens_total is None
            or sample.t_s <= prev.t_s):
        return sample
    rate = max(0.0, sample.tokens_total - prev.tokens_total) / (sample.t_s - prev.t_s)
    return replace(sample, tokens_per_s=round(rate, 2))


@dataclass(frozen=True)
class RoleSeries:
    """One role's series (servers of the role summed per tick) and its latest sample."""

    t_s: tuple[float, ...]
    queues: dict[str, tuple[int, ...]]
    pages: dict[str, tuple[int | None, ...]]
    tokens_per_s: tuple[float | None, ...]
    latest: RoleSample


@dataclass(frozen=True)
class Panel:
    """What the monitor shows: ``ticks`` samples taken, flagged so far, one series per role."""

    ticks: int
    flagged: int
    roles: dict[str, RoleSeries]


def _sum(values) -> int | float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _merge(t: float, role: str, samples: list[RoleSample]) -> RoleSample:
    """The servers of one role at one tick, summed."""
    queues, rooms = Counter(), Counter()
    for s in samples:
        queues.update(s.queues)
        rooms.update(s.rooms)
    return RoleSample(t, role, ",".join(s.server for s in samples), dict(queues), dict(rooms),
                      _sum(s.pages_free for s in samples), _sum(s.pages_cached for s in samples),
                      _sum(s.pages_quarantined for s in samples),
                      _sum(s.kv_usage for s in samples), _sum(s.tokens_total for s in samples),
                      _sum(s.tokens_per_s for s in samples), max(s.flagged for s in samples))


def panel(samples: list[RoleSample]) -> Panel:
    """The panel of every sample so far (ticks are distinct ``t_s``)."""
    by_tick: dict[tuple[float, str], list[RoleSample]] = {}
    for s in samples:
        by_tick.setdefault((s.t_s, s.role), []).append(s)
    roles: dict[str, list[RoleSample]] = {}
    for (t, role), group in sorted(by_tick.items()):
        roles.setdefault(role, []).append(_merge(t, role, group))
    return Panel(len({s.t_s for s in samples}), max((s.flagged for s in samples), default=0),
                 {role: _series(rows) for role, rows in roles.items()})


def _series(rows: list[RoleSample]) -> RoleSeries:
    names = sorted({q for r in rows for q in r.queues})
    return RoleSeries(
        tuple(r.t_s for r in rows),
        {q: tuple(r.queues.get(q, 0) for r in rows) for q in names},
        {k: tuple(getattr(r, f"pages_{k}") for r in rows)
         for k in ("free", "cached", "quarantined")},
        tuple(r.tokens_per_s for r in rows), rows[-1])
