"""Connection deadlines for every server (chat, prefill, decode, router), and the one place they
start uvicorn.

uvicorn (0.55, with h11: httptools is not installed, and ``run_server`` pins h11 either way)
closes an idle keep-alive connection only after a response, and any byte cancels that timer; it
has no header timeout. So a connection that never sends a request, or sends its head one byte a
second (slowloris), stayed open forever. ``HeadDeadlineProtocol`` adds the missing bound.

Invariants:

- a connection with no request in progress (just accepted, or its last response sent) is closed
  unless a complete request head arrives within ``HEAD_TIMEOUT_S``; bytes that do not complete
  the head never extend the deadline;
- after a response uvicorn's keep-alive (``SERVER_KEEP_ALIVE_S``) still closes a silent
  connection sooner; the deadline catches the one that dribbles;
- once a head is in, the deadline is off: a long generation or stream is the application's to
  bound (a slowly sent *body* is not bounded here).

A closed connection gets no answer (no 408): the client sent nothing worth answering.
"""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.h11_impl import H11Protocol

from engine.http.limits import SERVER_KEEP_ALIVE_S

log = logging.getLogger(__name__)
# Generous for any real client (a request head is a few hundred bytes, sent at once), short
# enough that 1,000 idle sockets are gone within seconds.
HEAD_TIMEOUT_S = 10.0


class HeadDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with the head deadline of the module docstring."""

    head_timeout_s: float = HEAD_TIMEOUT_S
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._in_request():
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request
        if not self._in_request():
            self._arm()

    def handle_websocket_upgrade(self, event) -> None:
        self._disarm()  # the connection now belongs to the websocket protocol
        super().handle_websocket_upgrade(event)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _in_request(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _arm(self) -> None:
        # never re-armed while armed: bytes of an incomplete head must not buy time
        if self._deadline is None and not self.transport.is_closing():
            self._deadline = self.loop.call_later(self.head_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        log.debug("closing %s: no complete request head within %gs", self.client,
                  self.head_timeout_s)
        self.transport.close()  # connection_lost settles h11's state


def run_server(app, host: str, port: int, **options) -> None:
    """``uvicorn.run`` with the shared connection limits (head deadline, keep-alive) and quiet
    logs; ``options`` are further ``uvicorn.run`` arguments."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, http=HeadDeadlineProtocol, log_level="warning",
                timeout_keep_alive=SERVER_KEEP_ALIVE_S, **options)
