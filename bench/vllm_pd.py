"""Real vLLM PD pair vs our embedded PD pair, same prompts, same run: start-up time, tool-call
accuracy through vLLM's own parser on held-out prompts, and end-to-end tokens/s at concurrency 1
and 16 through each pair's router (same-size models: data/llama for vLLM, data/model for ours).

``python -m bench.vllm_pd [--eval 200] [--write-eval data/llama/eval.json]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from bench.table import TableRow
from engine.text.dsml import LEAK_MARKERS
from engine.training.evaluate import eval_prompts
from workbench.deploy import PDPair, launch_pd_pair


@dataclass(frozen=True)
class ToolEval:
    prompts: int
    well_formed: float
    correct_tool: float
    exact_arguments: float
    seconds: float


@dataclass(frozen=True)
class Throughput:
    c1_tok_s: float
    c16_tok_s: float


@dataclass(frozen=True)
class VllmVsEmbedded:
    vllm_startup_s: float
    embedded_startup_s: float
    tool_eval: ToolEval
    vllm: Throughput
    embedded: Throughput

    def table_row(self) -> TableRow:
        v, e = self.vllm, self.embedded
        return TableRow("real vLLM PD pair vs ours",
                        f"vLLM: {v.c1_tok_s:.0f} tok/s at c=1, {v.c16_tok_s:.0f} at c=16; ours: "
                        f"{e.c1_tok_s:.0f} / {e.c16_tok_s:.0f}; vLLM tool calls well-formed "
                        f"{self.tool_eval.well_formed:.1%} of {self.tool_eval.prompts}; start-up "
                        f"{self.vllm_startup_s:.0f} s vs {self.embedded_startup_s:.0f} s",
                        v.c16_tok_s / e.c16_tok_s, "vLLM / ours, tokens/s at concurrency 16")


def _body(pair: PDPair, prompt_messages: list[dict], tools: list[dict], max_tokens: int) -> dict:
    body = {"messages": prompt_messages, "tools": tools, "max_tokens": max_tokens,
            "temperature": 0.0}
    return {**body, "model": pair.model} if pair.model else body


async def _run(pair: PDPair, bodies: list[dict], concurrency: int) -> list[dict]:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=300) as client:
        async def one(body: dict) -> dict:
            async with sem:
                r = await client.post(pair.url + "/v1/chat/completions", json=body)
                r.raise_for_status()
                return r.json()
        return await asyncio.gather(*(one(b) for b in bodies))


def _cases(n: int):
    for tr, _, expected in eval_prompts(n):
        msgs = tr.messages(upto_round=len(tr.rounds) - 1)
        yield msgs, [t.to_openai() for t in tr.tools], expected


def tool_eval(pair: PDPair, n: int, concurrency: int = 16) -> ToolEval:
    """Held-out prompts (the seeds ``engine.training.evaluate`` uses); a call is well-formed when
    the server's parser returned exactly one structured call and no DSML in ``content``."""
    cases = list(_cases(n))
    t0 = time.monotonic()
    outs = asyncio.run(_run(pair, [_body(pair, m, t, 160) for m, t, _ in cases], concurrency))
    formed = tool = exact = 0
    for (_, _, expected), out in zip(cases, outs, strict=True):
        msg = out["choices"][0]["message"]
        calls = msg.get("tool_calls") or []
        ok = len(calls) == 1 and not any(m in (msg.get("content") or "") for m in LEAK_MARKERS)
        formed += ok
        tool += ok and calls[0]["function"]["name"] == expected.name
        exact += ok and tool and json.loads(calls[0]["function"]["arguments"]) == \
            expected.arguments
    return ToolEval(n, formed / n, tool / n, exact / n, round(time.monotonic() - t0, 1))


def throughput(pair: PDPair, concurrency: int, requests: int, max_tokens: int = 64) -> float:
    """Completion tokens per wall second over ``requests`` requests at ``concurrency``."""
    cases = list(_cases(requests))
    bodies = [{**_body(pair, m, t, max_tokens), "ignore_eos": True} for m, t, _ in cases]
    asyncio.run(_run(pair, bodies[:2], 2))  # warm-up
    t0 = time.monotonic()
    outs = asyncio.run(_run(pair, bodies, concurrency))
    return sum(o["usage"]["completion_tokens"] for o in outs) / (time.monotonic() - t0)


def _pair_figures(backend: str, quick: bool) -> tuple[float, Throughput, PDPair]:
    t0 = time.monotonic()
    pair = launch_pd_pair(backend=backend)
    startup = time.monotonic() - t0
    n1, n16 = (4, 16) if quick else (8, 48)
    return startup, Throughput(throughput(pair, 1, n1), throughput(pair, 16, n16)), pair


def measure(eval_n: int = 200, quick: bool = False) -> VllmVsEmbedded:
    startup_v, tp_v, pair = _pair_figures("vllm", quick)
    with pair:
        ev = tool_eval(pair, eval_n)
    startup_e, tp_e, pair = _pair_figures("embedded", quick)
    pair.close()
    return VllmVsEmbedded(startup_v, startup_e, ev, tp_v, tp_e)


def report(res: VllmVsEmbedded) -> None:
    print(json.dumps(asdict(res), indent=1))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eval", type=int, default=200, help="held-out prompts for the tool eval")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--write-eval", type=Path, default=None,
                    help="write the tool eval as JSON (the model card's eval.json)")
    args = ap.parse_args(argv)
    res = measure(args.eval, args.quick)
    report(res)
    if args.write_eval:
        args.write_eval.write_text(json.dumps(asdict(res.tool_eval), indent=1) + "\n")


if __name__ == "__main__":
    main()
