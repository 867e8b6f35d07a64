"""Soak: a fixed PD pair under hundreds of sessions with client kills, then its leftovers.

Run ``python -m bench.soak [--sessions 256] [--rounds 2] [--kill-fraction 0.25] [--quick]``. Each
round is one seeded load (``inject_concurrency``, oracle on: every answer is compared with its solo
greedy reference, and an HTTP 200 that differs is a corrupted answer, the first figure printed) of
``sessions`` sessions x 2 turns in which ``kill_fraction`` of the requests are cancelled by their
client mid-flight. After the last round the pair drains (``workbench.observe.evidence.settle``).
Printed: requests served and judged correct, client errors by kind, pages and rooms left per role,
the transfer-state tables' sizes, and each process's resident memory before the first round, after
the first and after the last (growth after the first round is what a leak looks like; the first
round warms caches). The ratio is served-correct / requests that were not killed.
"""

from __future__ import annotations

import argparse
import logging
import re
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench.table import TableRow
from workbench.deploy import PDPair, launch_pd_pair
from workbench.drive import inject_concurrency
from workbench.observe import settle

log = logging.getLogger(__name__)


def rss_mib(pid: int) -> float:
    """Resident set size of ``pid`` in MiB (from /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"no VmRSS for pid {pid}")


def _rss(pair: PDPair) -> dict[str, float]:
    return {s.name: rss_mib(s.proc.pid) for s in pair.servers() if s.proc is not None}


@dataclass(frozen=True)
class SoakResult:
    corrupted: int  # answered 200 whose greedy tokens differ from the solo reference's
    sessions: int
    rounds: int
    requests: int
    killed: int
    served_correct: int
    flagged: int
    errors: dict[str, int]  # "status: message" -> count, for requests that were not killed
    left: dict[str, int]  # "role:what" -> count after draining (empty: nothing leaked)
    tables: dict[str, int]  # server -> rooms in its transfer-state table after draining
    rss_mib: dict[str, tuple[float, float, float]]  # server -> (start, after round 1, end)
    seconds: float

    @property
    def not_killed(self) -> int:
        return self.requests - self.killed

    def table_row(self) -> TableRow:
        growth = max((end - first for _, first, end in self.rss_mib.values()), default=0.0)
        errs = sum(self.errors.values())
        measured = (f"{self.corrupted} corrupted answers; "
                    f"{self.sessions} sessions x {self.rounds} rounds with kills: "
                    f"{self.served_correct}/{self.not_killed} served correct, {self.flagged} "
                    f"flagged, {errs} errors, {sum(self.left.values())} pages/rooms left, max RSS "
                    f"growth after round 1 {growth:.0f} MiB")
        ratio = self.served_correct / self.not_killed if self.not_killed else None
        return TableRow("soak", measured, ratio, "served correct / requests not killed")


def _errors(df) -> Counter:
    bad = df.filter((df["error"] != "") & ~df["killed"])
    return Counter(f"{s}: {re.sub(r'[0-9]{4,}', 'N', e)[:80]}" for s, e in
                   zip(bad["status"].to_list(), bad["error"].to_list(), strict=True))


def measure(sessions: int = 256, rounds: int = 2, kill_fraction: float = 0.25, seed: int = 0,
            max_tokens: int = 64, log_dir: Path | None = None) -> SoakResult:
    t0 = time.monotonic()
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="pdwb-soak-"))
    requests = killed = correct = flagged = corrupted = 0
    errors: Counter = Counter()
    with launch_pd_pair(log_dir=log_dir / "logs") as pair:
        rss = {k: [v] for k, v in _rss(pair).items()}
        for r in range(rounds):
            res = inject_concurrency(pair, sessions=sessions, turns=2, seed=seed + r,
                                     kill_fraction=kill_fraction, max_tokens=max_tokens,
                                     request_timeout_s=120.0, progress=False)
            s, df = res.summary, res.requests
            requests, killed, flagged = requests + s.requests, killed + s.killed, \
                flagged + s.flagged
            correct += int((~df["killed"] & (df["status"] == 200) & (df["error"] == "")
                            & ~df["flagged"]).sum())
            errors += _errors(df)
            corrupted += int((~df["killed"] & (df["status"] == 200)
                              & (df["v_ref_match"] == False)).sum())  # noqa: E712 - polars
            log.info("soak round %d: %s", r, s)
            if r == 0:
                for k, v in _rss(pair).items():
                    rss[k].append(v)
        drain = settle(pair, timeout_s=60.0)
        tables = {srv.name: len(pair.debug("/debug/transfers", srv)["rooms"])
                  for srv in [*pair.prefill, *pair.decode]}
        for k, v in _rss(pair).items():
            rss[k].append(v)
    return SoakResult(corrupted, sessions, rounds, requests, killed, correct, flagged,
                      dict(errors), drain.left, tables,
                      {k: (v[0], v[1], v[-1]) for k, v in rss.items()},
                      round(time.monotonic() - t0, 1))


def report(res: SoakResult) -> None:
    print(f"corrupted answers (200 with tokens other than the solo greedy reference's): "
          f"{res.corrupted}")
    print(f"{res.sessions} sessions x 2 turns x {res.rounds} rounds: {res.requests} requests, "
          f"{res.killed} killed by their client, {res.served_correct} of the other "
          f"{res.not_killed} served and judged correct, {res.flagged} flagged")
    print("errors by kind:", res.errors or "none")
    print("left after draining:", res.left or "nothing (no page or room leaked)")
    print("transfer-state table sizes after draining:", res.tables)
    for name, (start, first, end) in res.rss_mib.items():
        print(f"RSS {name:9} start {start:7.1f} MiB, after round 1 {first:7.1f}, end {end:7.1f} "
              f"(growth after round 1: {end - first:+.1f} MiB)")
    print(f"({res.seconds:.0f} s)")


def main(argv: list[str] | None = None) -> SoakResult:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--kill-fraction", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="64 sessions, 2 rounds")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    res = measure(64 if args.quick else args.sessions, args.rounds, args.kill_fraction, args.seed)
    report(res)
    return res


if __name__ == "__main__":
    main()
