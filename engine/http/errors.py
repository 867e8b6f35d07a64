"""Error answers shared by the server, the PD servers and the router (OpenAI error schema)."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
from collections.abc import AsyncIterator

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from engine.core.sequence import Failure, FailureKind

log = logging.getLogger(__name__)


class ErrorDetail(BaseModel):
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: int | str | None = None  # our servers put the HTTP status here


class ErrorResponse(BaseModel):
    """Error body: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorDetail

    @classmethod
    def from_validation_error(cls, exc: ValidationError) -> ErrorResponse:
        err = _primary_error(exc)
        lead = re.match(r"(?:Value error, )?(\w+): ", err["msg"])
        param = _loc_text(err["loc"]) or (lead.group(1) if lead else None)
        return cls(error=ErrorDetail(message=validation_error_message(exc), param=param))

    @classmethod
    def of_status(cls, status: int, message: str, param: str | None = None) -> ErrorResponse:
        """The body a server answers with ``status``: 5xx are ``server_error``, else
        ``invalid_request_error``; ``code`` is the status."""
        kind = "invalid_request_error" if status < 500 else "server_error"
        return cls(error=ErrorDetail(message=message, type=kind, param=param, code=status))


class BadRequestError(ValueError):
    """A request body the server refuses with 400; ``param`` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param

    status = 400

    def response(self) -> JSONResponse:
        return error_response(self.status, str(self), self.param)


class UnauthorizedError(BadRequestError):
    """A request without the credential its route needs (401, nothing of it is kept)."""

    status = 401


MAX_JSON_DEPTH = 64


def _non_finite(text: str) -> BadRequestError:
    return BadRequestError(f"request body holds a non-finite number ({text}): JSON numbers must "
                           "be finite")


def _no_constant(name: str):
    raise _non_finite(name)


def _finite_float(text: str) -> float:
    """Python's json reads ``1e999`` as inf; a body must not smuggle one past the refusal of the
    ``Infinity`` literal (the router answered 500 when re-encoding it)."""
    value = float(text)
    if not math.isfinite(value):
        raise _non_finite(text[:40])
    return value


def _check_tree(value, depth: int = 0) -> None:
    """Refuses nesting deeper than ``MAX_JSON_DEPTH`` and strings with lone surrogates."""
    if depth > MAX_JSON_DEPTH:
        raise BadRequestError(f"request body nests deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequestError("request body holds a lone UTF-16 surrogate") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_tree(k, depth + 1)
            _check_tree(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            _check_tree(v, depth + 1)


def json_object(raw: bytes) -> dict:
    """``raw`` as a JSON object (server and router parse bodies here); raises BadRequestError
    for invalid JSON, non-finite numbers (``NaN``, ``Infinity``, ``1e999``), nesting deeper than
    ``MAX_JSON_DEPTH`` and lone surrogates, so none of them can reach a handler as a 500."""
    try:
        body = json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)
    except BadRequestError:
        raise
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BadRequestError(f"request body is not valid JSON: {exc}"[:300]) from None
    if not isinstance(body, dict):
        raise BadRequestError("request body must be a JSON object")
    _check_tree(body)
    return body


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    """The answer with ``status`` and an ``ErrorResponse.of_status`` body (server and router)."""
    body = ErrorResponse.of_status(status, message, param)
    return JSONResponse(body.model_dump(), status_code=status)


FAILURE_STATUS = {FailureKind.ENGINE: 500, FailureKind.PEER: 502, FailureKind.TIMEOUT: 504}
CLIENT_CLOSED = 499  # nginx's status for a client that left before the answer (metrics, logs)


def failure_response(failure: Failure) -> JSONResponse:
    """The answer to a request an internal failure ended: 500 (engine), 502 (PD peer) or 504
    (KV transfer timeout), never 200 with ``finish_reason: "abort"``."""
    return error_response(FAILURE_STATUS[failure.kind], failure.message)


SSE_DONE = "data: [DONE]\n\n"


def stream_error(status: int, message: str, kind: str | None = None) -> str:
    """The SSE events that end a stream broken after its 200 went out: an ``ErrorResponse`` body
    (``code`` the status, ``type`` ``kind`` if given) and then ``[DONE]``, which ends every
    stream, failed or not."""
    body = ErrorResponse.of_status(status, message)
    if kind is not None:
        body.error.type = kind
    return f"data: {json.dumps(body.model_dump())}\n\n{SSE_DONE}"


def failure_event(failure: Failure) -> str:
    """``stream_error`` for a stream an internal failure broke (500, 502 or 504)."""
    return stream_error(FAILURE_STATUS[failure.kind], failure.message)


async def guarded_stream(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """``events``; should they raise, the stream still ends as the API promises, with a 500
    ``stream_error`` (the traceback is logged) rather than a cut connection."""
    async with contextlib.aclosing(events):
        try:
            async for event in events:
                yield event
        except Exception:
            log.exception("stream failed mid-way")
            yield stream_error(500, "internal error while streaming")


def validation_error_message(exc: ValidationError) -> str:
    """``"<field path>: <reason>"`` for the most specific error, e.g.
    ``"tools[0].function.parameters.properties.city.type: Input should be 'string', ..."``."""
    err = _primary_error(exc)
    msg = err["msg"].removeprefix("Value error, ")
    loc = _loc_text(err["loc"])
    return f"{loc}: {msg}" if loc else msg


def _primary_error(exc: ValidationError) -> dict:
    """The deepest error (first on ties): for unions this is the best-matching branch."""
    return max(exc.errors(), key=lambda e: len(_field_parts(e["loc"])))


def _field_parts(loc: tuple) -> list:
    """Drops pydantic's union-branch labels (``literal[...]``, ``NamedToolChoice``)."""
    return [p for p in loc if isinstance(p, int) or not ("[" in p or p == "NamedToolChoice")]


def _loc_text(loc: tuple) -> str:
    text = ""
    for p in _field_parts(loc):
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else p)
    return text


