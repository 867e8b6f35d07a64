"""Tool-call accuracy of a model on held-out seeded prompts, through the serving engine.

For held-out transcript seeds ``EVAL_SEED_BASE + i`` the prompt is the conversation up to the
last round's user ask; greedy output is parsed as DSML and compared with the expected call.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.config import EngineConfig
from engine.core import Engine, SamplingParams, Sequence
from engine.text import parse_tool_calls, render_prompt
from engine.training.datagen import EVAL_SEED_BASE, make_transcript

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalResult:
    prompts: int
    well_formed: float
    exact_arguments: float
    correct_tool: float
    seconds: float


def eval_prompts(n: int):
    for i in range(n):
        tr = make_transcript(EVAL_SEED_BASE + i)
        last = len(tr.rounds) - 1
        yield tr, render_prompt(tr.messages(upto_round=last), list(tr.tools)), tr.rounds[last].call


def evaluate(engine: Engine, n: int = 200, max_tokens: int = 160) -> EvalResult:
    t0 = time.time()
    cases = []
    for i, (tr, prompt, expected) in enumerate(eval_prompts(n)):
        seq = Sequence(f"eval-{i}", engine.tokenizer.encode(prompt), SamplingParams(max_tokens))
        cases.append((tr, expected, engine.submit(seq)))
    engine.run_until_idle()
    formed = exact = tool = 0
    for tr, expected, seq in cases:
        text = engine.tokenizer.decode([t for t in seq.output if t != engine.tokenizer.eos_id])
        parsed = parse_tool_calls(text, list(tr.tools))
        ok = not parsed.leaked and len(parsed.calls) == 1
        formed += ok
        tool += ok and parsed.calls[0].name == expected.name
        exact += ok and parsed.calls[0] == expected
    return EvalResult(n, formed / n, exact / n, tool / n, round(time.time() - t0, 1))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model-dir", default="data/model")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    engine = Engine(EngineConfig(model_dir=args.model_dir, max_running=256))
    res = evaluate(engine, args.n)
    text = json.dumps(asdict(res), indent=1)
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
