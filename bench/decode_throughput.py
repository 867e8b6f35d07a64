"""Decode throughput of the engine at batch 1 and batch 16 (same run, same prompts): tokens/s
and their ratio. ``python -m bench.decode_throughput [--tokens 64] [--kernels torch]``."""

from __future__ import annotations

import argparse
import time

from engine.config import EngineConfig
from engine.datagen import make_transcript
from engine.engine import Engine
from engine.sequence import SamplingParams, Sequence


def decode_rate(engine: Engine, batch: int, tokens: int) -> float:
    """Generated tokens per second over decode-only steps (prefill excluded)."""
    tk = engine.tokenizer
    seqs = [engine.submit(Sequence(f"b{batch}-{i}", tk.encode(make_transcript(i).text())[:300],
                                   SamplingParams(max_tokens=tokens, ignore_eos=True)))
            for i in range(batch)]
    while any(s.in_prefill or not s.output for s in seqs):
        engine.step()
    start_tokens, t0 = sum(len(s.output) for s in seqs), time.perf_counter()
    engine.run_until_idle()
    return (sum(len(s.output) for s in seqs) - start_tokens) / (time.perf_counter() - t0)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--kernels", default="torch")
    args = ap.parse_args(argv)
    engine = Engine(EngineConfig(kernels=args.kernels, prefix_cache=False))
    decode_rate(engine, 1, 4)  # warm-up
    r1 = decode_rate(engine, 1, args.tokens)
    r16 = decode_rate(engine, 16, args.tokens)
    print(f"decode tokens/s  batch1 {r1:8.1f}  batch16 {r16:8.1f}  ratio {r16 / r1:5.2f}x")
    return {"batch1_tok_s": r1, "batch16_tok_s": r16, "ratio": r16 / r1}


if __name__ == "__main__":
    main()
