"""Messages into the engine thread's inbox, dispatched by type on the engine thread."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.core.sequence import Sequence


@dataclass(frozen=True)
class AddRequest:
    seq: Sequence


@dataclass(frozen=True)
class AbortRequest:
    rid: str


@dataclass(frozen=True)
class CallSoon:
    fn: Callable[[], None]


InboxMessage = AddRequest | AbortRequest | CallSoon
MESSAGE_TYPES = (AddRequest, AbortRequest, CallSoon)
