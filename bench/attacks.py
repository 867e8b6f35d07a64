"""Attacks on a PD deployment, each judged by its victims: does any victim get HTTP 200 with an
answer other than its solo greedy reference?

Run ``python -m bench.attacks [--attempts 100] [--race-requests 1000]``. The deployment is the
README's (a generated ``PDWB_PD_SECRET``, decode with ``--prefill-allow``, router ``--seed 0``)
with a recording proxy (``bench.tap``) on the decode-prefill path, so the attacker knows what a
man in the middle knows: the decode's agent name, real preallocs, rooms, pages and aux slots.
Every attack runs once without and once with the deployment secret (an insider):

- ``squat``: register the rooms a ``--seed 0`` router would draw, with the attacker's prompt, on
  the prefill and the decode, then send a victim;
- ``forge``: while a victim decodes, prealloc its pages and aux slot for a room of the
  attacker's (signed with the shared secret, the best key the attacker has) and trigger the
  write with a chat request for that room;
- ``replay``: while a victim decodes, replay its own recorded prealloc and trigger its room
  again with the attacker's prompt.

``reuse_race``: at a small decode pool (``num_pages=160``) and ``max_tokens=1`` with 32 workers,
the count of requests that fail with a prealloc conflict (409), which the decode's page hold
removes by construction. Printed: per attack and secret, victims, corrupted victims, and what the
servers answered the attacker.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import secrets
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from engine.config import EngineConfig
from engine.disagg.messages import Prealloc
from engine.http import SECRET_ENV, SECRET_HEADER
from engine.training.datagen import make_transcript
from workbench.deploy import ServerProcess, launch_pd_pair
from workbench.deploy.launch import DEBUG_TOKEN_ENV
from workbench.deploy.process import python_module
from workbench.judge import ReferenceOracle

log = logging.getLogger(__name__)
ATTACKS = ("squat", "forge", "replay")


@dataclass
class AttackResult:
    attack: str
    with_secret: bool
    victims: int = 0
    corrupted: int = 0
    failed: int = 0  # victims that got no 200 (an attack may deny service; it may not corrupt)
    answers: Counter = field(default_factory=Counter)  # attacker's HTTP statuses


@dataclass
class Deployment:
    """Prefill, tap, decode and router processes; ``record`` holds the tapped preallocs."""

    procs: list[ServerProcess]
    prefill: ServerProcess
    tap: ServerProcess
    decode: ServerProcess
    router: ServerProcess
    record: Path
    secret: str

    def close(self) -> None:
        for p in reversed(self.procs):
            p.stop()

    def preallocs(self) -> list[dict]:
        text = self.record.read_text() if self.record.exists() else ""
        return [json.loads(line) for line in text.splitlines()]


def deploy(log_dir: Path, source: Path | None = None) -> Deployment:
    """The deployment; ``source``: a checkout (e.g. an older commit's worktree) its servers and
    router run from, to show what the attacks did before."""
    env = {SECRET_ENV: secrets.token_hex(24), DEBUG_TOKEN_ENV: secrets.token_hex(16),
           **({"PYTHONPATH": str(source)} if source else {})}
    record = log_dir / "preallocs.jsonl"
    serve = ("engine", "serve", "--port", "{port}")
    prefill = ServerProcess("prefill", python_module(*serve, "--role", "prefill"), log_dir,
                            env=env, cwd=source)
    procs = [prefill.start()]
    try:
        prefill.wait_healthy(120)
        tap = ServerProcess("tap", python_module("bench.tap", "--target", prefill.url, "--port",
                                                 "{port}", "--record", str(record)), log_dir)
        decode = ServerProcess("decode", python_module(*serve, "--role", "decode",
                                                       "--prefill-allow", tap.url), log_dir,
                               env=env, cwd=source)
        router = ServerProcess("router", python_module(
            "engine.router", "--port", "{port}", "--seed", "0", "--prefill", tap.url,
            "--decode", decode.url), log_dir, env=env, cwd=source)
        for p in (tap, decode, router):
            procs.append(p.start())
            p.wait_healthy(120)
    except BaseException:
        for p in reversed(procs):
            p.stop()
        raise
    return Deployment(procs, prefill, tap, decode, router, record, env[SECRET_ENV])


class Victims:
    """Greedy tool-calling requests through the router, judged against solo references."""

    def __init__(self, router_url: str, seed: int) -> None:
        self.url, self.seed = router_url, seed
        self.oracle = ReferenceOracle(EngineConfig())
        self._expected: dict[int, list[int]] = {}

    def body(self, i: int, max_tokens: int) -> dict:
        """Victim ``i``'s request (10 distinct prompts); past 64 tokens it ignores EOS, so it is
        still decoding when an attack lands."""
        tr = make_transcript(self.seed * 100_000 + i % 10)
        return {"messages": tr.messages(upto_round=0), "tools": [t.to_openai() for t in tr.tools],
                "max_tokens": max_tokens, "return_token_ids": True,
                "ignore_eos": max_tokens > 64}

    def expected(self, i: int, body: dict) -> list[int]:
        key = (i % 10, body["max_tokens"])
        if key not in self._expected:
            prompt = self.oracle.prompt_ids(body["messages"], body["tools"])
            eos = -1 if body["ignore_eos"] else self.oracle.tokenizer.eos_id
            self._expected[key] = self.oracle.reference.generate(prompt, body["max_tokens"], eos)
        return self._expected[key]

    def ask(self, i: int, max_tokens: int) -> str:
        """Sends victim ``i``; its verdict (a timeout is ``failed``)."""
        body = self.body(i, max_tokens)
        try:
            resp = httpx.post(self.url + "/v1/chat/completions", json=body, timeout=60)
        except httpx.TimeoutException:
            return "failed"
        return self.judge(i, body, resp)

    def judge(self, i: int, body: dict, resp: httpx.Response) -> str:
        """``ok``, ``corrupted`` (200, wrong tokens) or ``failed`` (no 200)."""
        if resp.status_code != 200:
            return "failed"
        ids = resp.json()["choices"][0]["token_ids"]
        return "ok" if ids == self.expected(i, body) else "corrupted"


def _post(url: str, body: dict, headers: dict, timeout: float = 2.0) -> int:
    """The attacker's request; 0 when it timed out (it waits on a room nobody serves)."""
    try:
        r = httpx.post(url, json=body, headers=headers, timeout=timeout)
    except httpx.TimeoutException:
        return 0
    log.debug("attacker %s: %d %.200s", url, r.status_code, r.text)
    return r.status_code


def _room_body(room: int, port: int, i: int) -> dict:
    tr = make_transcript(777_000 + i)
    return {"messages": tr.messages(upto_round=0), "max_tokens": 4, "bootstrap_room": room,
            "bootstrap_host": "127.0.0.1", "bootstrap_port": port}


SEEDED = random.Random(0)
SEEDED_ROOMS = [SEEDED.getrandbits(63) for _ in range(20_000)]  # a --seed 0 router's rooms


def _next_rooms(d: Deployment, v: Victims, guesses: random.Random) -> list[int]:
    """The attacker's guess at the next 4 rooms: after its own request's room in the seeded
    sequence when that is where it sits, else 4 draws of its own."""
    try:
        r = httpx.post(d.router.url + "/v1/chat/completions", json=v.body(0, 1), timeout=60)
        room = int(r.headers.get("x-bootstrap-room", -1))
    except httpx.TimeoutException:
        room = -1
    if room in SEEDED_ROOMS:
        at = SEEDED_ROOMS.index(room)
        return SEEDED_ROOMS[at + 1:at + 5]
    return [guesses.getrandbits(63) for _ in range(4)]


def squat(d: Deployment, v: Victims, i: int, auth: dict, res: AttackResult,
          guesses: random.Random) -> str:
    bodies = [_room_body(room, d.tap.port, i) for room in _next_rooms(d, v, guesses)]
    posts = [(d.prefill.url + "/v1/chat/completions", b) for b in bodies]
    with ThreadPoolExecutor(len(posts)) as pool:
        held = pool.map(lambda p: _post(p[0], p[1], auth, 3.0), posts)
        time.sleep(0.3)  # the squatters wait on their rooms when the victim comes
        verdict = v.ask(i, 40)
        for status in held:
            res.answers[status] += 1
    return verdict


def _forged(real: dict, room: int, key: bytes) -> dict:
    """``real``'s pages and aux slot for ``room``, numbered past it, fresh, signed in the real
    format with ``key`` (the attacker has the source, not the decode's key)."""
    msg = Prealloc.from_json({**real, "room": room, "seq": real.get("seq", 0) + 10_000,
                              "issued_at": time.time()})
    return msg.signed(key).to_json()


def _during_victim(d: Deployment, v: Victims, i: int, attack) -> str:
    """Runs ``attack(victim_prealloc)`` while victim ``i`` decodes; the victim's verdict."""
    seen = len(d.preallocs())
    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(v.ask, i, 160)
        deadline = time.monotonic() + 30
        while len(d.preallocs()) <= seen and time.monotonic() < deadline:
            time.sleep(0.01)
        mine = d.preallocs()[seen:]
        time.sleep(0.4)  # its prefill is done: the victim decodes, the prefill holds no room
        if mine:
            attack(mine[0])
        return fut.result()


def forge(d: Deployment, v: Victims, i: int, auth: dict, res: AttackResult) -> str:
    def hit(real: dict) -> None:
        room = secrets.randbits(63)
        msg = _forged(real, room, d.secret.encode())
        res.answers[_post(d.prefill.url + "/disagg/prealloc", msg, auth)] += 1
        res.answers[_post(d.prefill.url + "/v1/chat/completions",
                          _room_body(room, d.tap.port, i), auth, 0.5)] += 1
    return _during_victim(d, v, i, hit)


def replay(d: Deployment, v: Victims, i: int, auth: dict, res: AttackResult) -> str:
    """Replays the victim's own prealloc while it decodes, and triggers its room again."""
    def hit(real: dict) -> None:
        res.answers[_post(d.prefill.url + "/disagg/prealloc", real, auth)] += 1
        res.answers[_post(d.prefill.url + "/v1/chat/completions",
                          _room_body(real["room"], d.tap.port, i), auth, 0.5)] += 1
    return _during_victim(d, v, i, hit)


def run_attacks(attempts: int, seed: int = 0, log_dir: Path | None = None,
                source: Path | None = None, attacks: tuple[str, ...] = ATTACKS
                ) -> list[AttackResult]:
    """Every attack ``attempts`` times without and with the secret, on one deployment."""
    d = deploy(Path(log_dir or tempfile.mkdtemp(prefix="pdwb-attacks-")), source)
    out = []
    try:
        v = Victims(d.router.url, seed)
        httpx.post(d.router.url + "/v1/chat/completions", json=v.body(0, 4), timeout=120)
        for name in attacks:
            for with_secret in (False, True):
                out.append(_one_attack(d, v, name, with_secret, attempts))
    finally:
        d.close()
    return out


def _one_attack(d: Deployment, v: Victims, name: str, with_secret: bool,
                attempts: int) -> AttackResult:
    res = AttackResult(name, with_secret)
    auth = {SECRET_HEADER: d.secret} if with_secret else {}
    guesses = random.Random(0)  # the rooms a --seed 0 router used to draw
    for i in range(attempts):
        if name == "squat":
            verdict = squat(d, v, i, auth, res, guesses)
        else:
            verdict = (forge if name == "forge" else replay)(d, v, i, auth, res)
        res.victims += 1
        res.corrupted += verdict == "corrupted"
        res.failed += verdict == "failed"
    log.info("%s", res)
    return res


@dataclass(frozen=True)
class RaceResult:
    requests: int
    ok: int
    conflicts: int  # failed with a prealloc 409
    other_errors: Counter


def reuse_race(requests: int = 1000, workers: int = 32, num_pages: int = 160,
               log_dir: Path | None = None, source: Path | None = None) -> RaceResult:
    """``requests`` one-token requests from ``workers`` threads at a ``num_pages`` pool."""
    with launch_pd_pair(engine={"num_pages": num_pages}, log_dir=log_dir,
                        source=source) as pair:
        v = Victims(pair.url, 1)

        def one(i: int) -> tuple[int, str]:
            r = httpx.post(pair.url + "/v1/chat/completions", json=v.body(i, 1), timeout=120)
            return r.status_code, r.text[:200] if r.status_code != 200 else ""
        with ThreadPoolExecutor(workers) as pool:
            answers = list(pool.map(one, range(requests)))
    errors = Counter(f"{s}: {t[:80]}" for s, t in answers if s != 200)
    conflicts = sum(n for k, n in errors.items() if "409" in k)
    return RaceResult(requests, sum(s == 200 for s, _ in answers), conflicts, errors)


def main() -> None:
    ap = argparse.ArgumentParser(prog="bench.attacks")
    ap.add_argument("--attempts", type=int, default=100)
    ap.add_argument("--race-requests", type=int, default=1000)
    ap.add_argument("--source", type=Path, default=None,
                    help="run the servers from this checkout (e.g. a worktree of an old commit)")
    ap.add_argument("--attacks", nargs="*", default=list(ATTACKS), choices=ATTACKS)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    t0 = time.monotonic()
    for r in run_attacks(args.attempts, source=args.source, attacks=tuple(args.attacks)):
        secret = "with secret" if r.with_secret else "no secret"
        print(f"{r.attack:7s} {secret:12s} victims {r.victims:4d}  corrupted {r.corrupted:3d}  "
              f"failed {r.failed:3d}  attacker got {dict(sorted(r.answers.items()))}")
    race = reuse_race(args.race_requests, source=args.source)
    print(f"reuse race: {race.ok}/{race.requests} served, {race.conflicts} prealloc 409s, "
          f"other errors {dict(race.other_errors)}")
    print(f"{time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
