"""Replay one recorded request alone (concurrency 1, the same body) and say whether it still
differs from the reference and from what was served under load."""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx

from workbench.deploy import PDPair, client_headers, launch_pd_pair
from workbench.drive.load import LoadConfig, chat_body
from workbench.drive.solo import run_alone
from workbench.judge.oracle import first_difference

ReplayTarget = PDPair | str | dict  # a live pair, a URL, or launch_pd_pair's arguments


@dataclass(frozen=True)
class Replay:
    """``first_diff``: first position where the replay differs from the reference (None: same);
    ``same_as_served``: the replay equals the tokens served under load."""

    request: int
    token_ids: tuple[int, ...] | None
    first_diff: int | None
    same_as_served: bool | None
    has_reference: bool

    @property
    def still_differs(self) -> bool | None:
        """True when the replay alone still differs from the reference (None: no reference)."""
        return (self.first_diff is not None) if self.has_reference else None

    def describe(self) -> str:
        if self.token_ids is None:
            return f"#{self.request}: the replay returned no token ids"
        ref = {None: "no reference to compare", True: f"still differs from the reference "
               f"(first at position {self.first_diff})", False: "matches the reference alone"}
        served = {None: "", True: "; same tokens as under load",
                  False: "; not the tokens served under load"}
        return (f"#{self.request} replayed alone: {ref[self.still_differs]}"
                f"{served[self.same_as_served]}")


def body_of(row: dict) -> dict:
    """The exact body the load sent for ``row`` (greedy, seeded by session), non-streaming."""
    cfg = LoadConfig(max_tokens=row.get("max_tokens") or LoadConfig.max_tokens)
    return chat_body(cfg, json.loads(row["messages"]), json.loads(row["tools"]), row["session"],
                     stream=False)


def compare(row: dict, token_ids: tuple[int, ...] | None) -> Replay:
    """The replay's tokens against ``row``'s reference and served tokens."""
    ref = json.loads(row["ref_token_ids"]) if row.get("ref_token_ids") else None
    served = json.loads(row["token_ids"]) if row.get("token_ids") else None
    ids = list(token_ids) if token_ids is not None else None
    diff = first_difference(ids, ref) if ids is not None and ref is not None else None
    same = (ids == served) if ids is not None and served is not None else None
    return Replay(row["request"], token_ids, diff, same, ref is not None)


def _send(url: str, body: dict, headers: dict, timeout_s: float) -> tuple[int, ...] | None:
    with httpx.Client(timeout=timeout_s, headers=headers) as client:
        return run_alone(client, url, body).token_ids


def replay_alone(row: dict, target: ReplayTarget, timeout_s: float = 120.0) -> Replay:
    """Sends ``row``'s request alone to ``target``; a dict target launches a fresh pair with
    those ``launch_pd_pair`` arguments for this one replay (and stops it)."""
    body = body_of(row)
    if isinstance(target, dict):
        with launch_pd_pair(**target) as pair:
            return compare(row, _send(pair.url, body, client_headers(pair), timeout_s))
    if isinstance(target, PDPair):
        return compare(row, _send(target.url, body, client_headers(target), timeout_s))
    return compare(row, _send(str(target).rstrip("/"), body, {}, timeout_s))
