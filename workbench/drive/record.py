"""One request of a load as the client saw it, judged: ``RequestRecord`` and its table row
(the columns a load's ``requests`` DataFrame has)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from engine.core.dump import prompt_hash
from workbench.drive.dialects import RequestParams
from workbench.judge import Verdict
from workbench.judge.features import ORACLES, FeatureVerdict


@dataclass
class RequestRecord:
    session: int
    turn: int
    kind: str  # "call" (expects a tool call) or "answer"
    room: int | None = None
    status: int | None = None
    killed: bool = False
    ttft_s: float | None = None
    itl_s: float | None = None
    e2e_s: float | None = None
    finish_reason: str | None = None
    content: str = ""
    tool_calls: list[dict] = field(default_factory=list)
    token_ids: list[int] | None = None
    token_texts: list[str] = field(default_factory=list)  # from logprobs, when ids are not sent
    logprobs: list[float | None] | None = None  # per generated token, None where unknown
    prompt_ids: list[int] | None = None
    messages: list[dict] = field(default_factory=list)  # the request's messages, for replays
    tools: list[dict] = field(default_factory=list)
    dsml_leaked: bool | None = None
    error: str = ""
    started_at: float | None = None  # wall clock (epoch s), to line requests up with deaths
    ended_at: float | None = None
    engine_down: str = ""  # the death or hang of the deployment this request ran into
    verdict: Verdict | None = None
    max_tokens: int | None = None  # what was asked (a replay sends the same)
    ref_token_ids: list[int] | None = None  # the oracle's greedy tokens, when it judged
    ref_logprobs: list[float] | None = None
    params: RequestParams = field(default_factory=RequestParams)  # the API features it used
    usage: dict | None = None  # the response's usage, as sent
    top_logprobs: list[list[tuple[str, float]]] = field(default_factory=list)
    features: FeatureVerdict | None = None  # the per-feature oracles' verdicts

    def row(self) -> dict:
        out = {k: v for k, v in asdict(self).items()
               if k not in ("verdict", "tool_calls", "token_ids", "token_texts", "prompt_ids",
                            "messages", "tools", "logprobs", "ref_token_ids", "ref_logprobs",
                            "params", "usage", "top_logprobs", "features")}
        out["tool_calls"] = json.dumps(self.tool_calls)
        out["messages"] = json.dumps(self.messages)
        out["tools"] = json.dumps(self.tools)
        out["token_ids"] = json.dumps(self.token_ids)
        for key in ("logprobs", "ref_token_ids", "ref_logprobs"):  # for the explorer's views
            out[key] = json.dumps(getattr(self, key))
        out["prompt_tokens"] = len(self.prompt_ids) if self.prompt_ids is not None else None
        out["prompt_hash"] = prompt_hash(self.prompt_ids) if self.prompt_ids else None
        v = self.verdict
        out.update({f"v_{k}": getattr(v, k) if v else None for k in
                    ("leaked", "dropped", "well_formed", "tool_ok", "args_ok", "ref_match",
                     "first_diff", "oracle_error", "aborted")})
        out["v_logprob_drift"] = v.drifted if v else None  # the flag (issue 25's name)
        out["v_logprob_drift_max"] = v.logprob_drift if v else None  # its value
        out["features"] = ",".join(f.value for f in self.params.features())
        out["params"] = json.dumps(asdict(self.params))
        fv = self.features or FeatureVerdict()
        out.update({f"v_{name}_ok": getattr(fv, f"{name}_ok") for name in ORACLES})
        out["flagged"] = bool(v and v.flagged) or bool(fv.failed)
        out["corrupt_leak"] = bool(v and v.leaked and v.ref_match is False)
        return out
