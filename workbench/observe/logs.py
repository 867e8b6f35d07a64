"""Server and router logs as evidence: the warning and error lines around flagged requests.

``log_evidence(log_dir, rooms=..., rids=..., window=...)`` reads every ``*.log`` under a pair's
log directory (``PDPair.log_dir``: ``router.log``, ``prefill0.log``, ``decode0.log``) and keeps
the lines that read as a warning or an error (``ALERT``) and either name one of the flagged
rooms or request ids, or carry a timestamp inside ``window`` (epoch seconds; the servers log
``%(asctime)s``, local time). Lines naming a request come first; each keeps its file's name.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ALERT = re.compile(r"warn|error|fail|refus|exception|traceback|already used|timed out|"
                   r"answered [45]\d\d|broke", re.IGNORECASE)
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")
MAX_LINE = 300


@dataclass(frozen=True)
class LogLine:
    """One quoted log line: ``file`` (its name in the log directory), ``line`` (truncated),
    ``named``: it names a flagged room or request (else it matched the time window only)."""

    file: str
    line: str
    named: bool

    def describe(self) -> str:
        return f"{self.file}: {self.line}"


def stamp(line: str) -> float | None:
    """The epoch time of a log line's ``asctime`` prefix (None: the line has none)."""
    m = _STAMP.match(line)
    if m is None:
        return None
    return time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1e3


def log_evidence(log_dir: str | Path | None, rooms: Iterable[int] = (), rids: Iterable[str] = (),
                 window: tuple[float, float] | None = None, limit: int = 8) -> tuple[LogLine, ...]:
    """Up to ``limit`` alerting lines of the logs under ``log_dir`` that name one of ``rooms`` or
    ``rids`` (first) or fall inside ``window`` (see the module docstring); () without logs."""
    if log_dir is None or not Path(log_dir).is_dir():
        return ()
    names = [str(r) for r in rooms] + [r for r in rids if r]
    keys = re.compile("|".join(rf"\b{re.escape(k)}\b" for k in names) or "(?!)")  # none: none
    named, timed = [], []
    for path in sorted(Path(log_dir).rglob("*.log")):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for raw in text.splitlines():
            if not ALERT.search(raw):
                continue
            line = raw.strip()[:MAX_LINE]
            if keys.search(_STAMP.sub("", raw)):  # a room or rid, never the timestamp's digits
                named.append(LogLine(path.name, line, True))
            elif window is not None and (t := stamp(raw)) is not None \
                    and window[0] <= t <= window[1]:
                timed.append(LogLine(path.name, line, False))
    seen, out = set(), []
    for ln in named + timed:
        if (ln.file, ln.line) not in seen:
            seen.add((ln.file, ln.line))
            out.append(ln)
    return tuple(out[:limit])
