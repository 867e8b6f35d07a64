"""The seed oracle: a seeded sampled request must give the same tokens alone as it gave in the
burst (sampling is a function of the logits and the request's own generator, so batching,
caching and transfer must not change it). After a burst, ``check_seeded`` sends up to
``SEED_REPLAYS`` of its completed sampled requests again, one at a time, with the same body,
and sets each one's ``seed_ok``."""

from __future__ import annotations

import dataclasses
import logging

import httpx

from workbench.drive.client import send_chat
from workbench.drive.record import RequestRecord
from workbench.judge.features import FeatureVerdict

log = logging.getLogger(__name__)
SEED_REPLAYS = 16  # per burst: each is a request alone, after the burst


def replayable(rec: RequestRecord) -> bool:
    return (rec.params.sampled and not rec.killed and rec.status == 200 and not rec.error
            and rec.token_ids is not None and rec.finish_reason != "abort")


async def check_seeded(client: httpx.AsyncClient, url: str, body_of, records: list[RequestRecord],
                       limit: int = SEED_REPLAYS) -> int:
    """Replays the first ``limit`` replayable records (in session, turn order) alone;
    ``body_of(rec)`` rebuilds the body that was sent. Returns how many were replayed."""
    chosen = sorted((r for r in records if replayable(r)),
                    key=lambda r: (r.session, r.turn, r.kind))[:limit]
    for rec in chosen:
        alone = RequestRecord(rec.session, rec.turn, rec.kind, params=rec.params)
        try:
            await send_chat(client, url, body_of(rec), alone)
        except httpx.HTTPError as exc:
            log.warning("seed replay of session %d turn %d failed: %s", rec.session, rec.turn, exc)
            continue
        if alone.status != 200 or alone.token_ids is None:
            continue
        same = alone.token_ids == rec.token_ids
        rec.features = dataclasses.replace(rec.features or FeatureVerdict(), seed_ok=same)
    return len(chosen)
