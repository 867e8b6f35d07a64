"""Prometheus text-format metrics for the HTTP server."""

from __future__ import annotations

import threading
from collections import Counter


class Metrics:
    """Thread-safe counters plus gauges read from the engine at scrape time."""

    def __init__(self, prefix: str = "pdwb") -> None:
        self.prefix = prefix
        self._lock = threading.Lock()
        self.counters: Counter[tuple[str, tuple[tuple[str, str], ...]]] = Counter()

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        with self._lock:
            self.counters[(name, tuple(sorted(labels.items())))] += value

    def render(self, gauges: dict[str, float]) -> str:
        lines = []
        with self._lock:
            items = sorted(self.counters.items())
        for (name, labels), value in items:
            lab = ",".join(f'{k}="{v}"' for k, v in labels)
            lines.append(f"# TYPE {self.prefix}_{name} counter")
            lines.append(f"{self.prefix}_{name}{{{lab}}} {value}" if lab
                         else f"{self.prefix}_{name} {value}")
        for name, value in sorted(gauges.items()):
            lines.append(f"# TYPE {self.prefix}_{name} gauge")
            lines.append(f"{self.prefix}_{name} {value}")
        return "\n".join(lines) + "\n"


def engine_gauges(engine) -> dict[str, float]:
    sched, stats = engine.scheduler, engine.stats
    return {
        "running_requests": len(sched.running),
        "waiting_requests": len(sched.waiting),
        "free_pages": engine.allocator.num_free,
        "total_pages": engine.allocator.num_pages,
        "prefix_cache_pages": engine.cache.num_pages if engine.cache else 0,
        "engine_steps": stats.steps,
        "prompt_tokens": stats.prompt_tokens,
        "generated_tokens": stats.generated_tokens,
        "cached_prompt_tokens": stats.cached_tokens,
        "engine_busy_seconds": round(stats.busy_seconds, 6),
    }
