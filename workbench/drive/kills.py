"""Clients that disconnect mid-flight (a kill storm) and the probe that asks whether a fresh
request is still served afterwards (a wedge shows as ``False``)."""

from __future__ import annotations

import asyncio

import httpx

from engine.training.datagen import make_transcript
from workbench.deploy import PDPair
from workbench.drive.concurrency import run_sync


def wedge_probe(pair: PDPair, timeout_s: float = 15.0, seed: int = 0) -> bool:
    """True when a fresh 4-token request completes through the router within ``timeout_s``."""
    tr = make_transcript(900_000 + seed)
    body = {"messages": tr.messages(upto_round=0), "tools": [t.to_openai() for t in tr.tools],
            "max_tokens": 4, **({"model": pair.model} if pair.model else {})}
    try:
        r = httpx.post(pair.url + "/v1/chat/completions", json=body, timeout=timeout_s,
                       headers=pair.headers)
    except httpx.HTTPError:  # timed out, or the router is gone: not served either way
        return False
    return r.status_code == 200


async def _kill_storm(url: str, n: int, kill_at_s: float, seed: int, max_tokens: int,
                      model: str | None, headers: dict[str, str]) -> int:
    tr = make_transcript(800_000 + seed)
    body = {"messages": tr.messages(upto_round=0), "tools": [t.to_openai() for t in tr.tools],
            "max_tokens": max_tokens, "stream": True, **({"model": model} if model else {})}
    killed = 0
    async with httpx.AsyncClient(timeout=60, headers=headers) as client:
        async def one(i: int) -> None:
            nonlocal killed
            try:
                await asyncio.wait_for(client.post(url + "/v1/chat/completions", json=body),
                                       kill_at_s + 0.05 * i)
            except asyncio.TimeoutError:
                killed += 1
            except httpx.HTTPError:  # refused or broken: nothing to disconnect
                pass
        await asyncio.gather(*(one(i) for i in range(n)))
    return killed


def kill_storm(pair: PDPair, n: int = 5, kill_at_s: float = 0.8, seed: int = 0,
               max_tokens: int = 8) -> int:
    """Sends ``n`` streaming requests and disconnects each at ``kill_at_s + 0.05*i`` seconds.

    Sized for a pair whose transfers are slowed (``transfer_fixed_ms``) so that the kills land
    while the decode waits for KV. Returns how many clients were killed before completion.
    """
    return run_sync(_kill_storm(pair.url, n, kill_at_s, seed, max_tokens, pair.model,
                                pair.headers))
