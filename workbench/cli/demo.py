"""``wb demo`` (``make demo``): the flagship investigation end to end, written as HTML reports.

Runs notebook 01 (reproduce the tool-call corruption on the buggy variants, show it vanishes
on the fixed ones) and notebook 02 (dump index-K at a failing request, diff it against the
reference, localize the stale layer/positions) on the embedded engine, then says where the
reports are. ``wb demo --conversation`` instead starts one server on the shipped model and plays
an agentic tool-call conversation (tools "execute" to seeded results, replayable by
``--seed``). The flags are ``wb demo``'s (``workbench.cli.parser``).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import openai

from engine.training.datagen import EVAL_SEED_BASE, make_transcript
from workbench.deploy.process import ServerProcess, python_module

log = logging.getLogger("workbench.cli.demo")


def run_conversation(base_url: str, seed: int) -> list[dict]:
    """Plays every round of a held-out transcript through the server; returns the messages."""
    tr = make_transcript(EVAL_SEED_BASE + seed)
    tools = [t.to_openai() for t in tr.tools]
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="none", max_retries=0)
    messages: list[dict] = tr.messages()[:1]
    for rnd in tr.rounds:
        messages.append({"role": "user", "content": rnd.ask})
        log.info("user: %s", rnd.ask)
        reply = client.chat.completions.create(model="tiny-deepseek", messages=messages,
                                               tools=tools, max_tokens=160).choices[0]
        calls = reply.message.tool_calls or []
        if not calls:
            log.warning("no tool call (dsml_leaked=%s): %r", reply.model_extra.get("dsml_leaked"),
                        reply.message.content)
            break
        fn = calls[0].function
        log.info("tool call: %s(%s)  expected %s(%s)", fn.name, fn.arguments, rnd.call.name,
                 json.dumps(rnd.call.arguments))
        messages += [{"role": "assistant", "content": None,
                      "tool_calls": [c.model_dump() for c in calls]},
                     {"role": "tool", "tool_call_id": calls[0].id, "content": rnd.result}]
        final = client.chat.completions.create(model="tiny-deepseek", messages=messages,
                                               tools=tools, max_tokens=80).choices[0]
        log.info("assistant: %s", final.message.content)
        messages.append({"role": "assistant", "content": final.message.content})
    return messages


def conversation(seed: int, log_dir: Path) -> None:
    srv = ServerProcess("engine", python_module("engine", "serve", "--port", "{port}"),
                        log_dir).start()
    try:
        srv.wait_healthy()
        run_conversation(srv.url, seed)
    finally:
        srv.stop()


FLAGSHIP = ("01_reproduce_corruption.py", "02_localize_index_k.py")


def investigation(out_dir: Path, seed: int) -> list[Path]:
    """Executes the flagship notebooks; a finding that no longer holds fails the run."""
    from workbench.report.render import run_report

    nb_dir = Path(__file__).resolve().parents[2] / "notebooks"
    t0 = time.monotonic()
    reports = [run_report(nb_dir / name, {"seed": seed}, out_dir) for name in FLAGSHIP]
    log.info("investigation done in %.0f s", time.monotonic() - t0)
    return reports
