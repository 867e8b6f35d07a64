"""Decode throughput of the engine at batch 1 and batch 16 (same run, same prompts): tokens/s
and their ratio. ``python -m bench.decode_throughput [--tokens 64] [--kernels torch]``."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from bench.table import TableRow
from engine.config import EngineConfig
from engine.core import Engine, SamplingParams, Sequence
from engine.training import make_transcript


@dataclass(frozen=True)
class DecodeThroughput:
    """Decode-only tokens/s at batch 1 and 16, measured back to back on one engine."""

    tokens: int
    kernels: str
    batch1_tok_s: float
    batch16_tok_s: float

    @property
    def ratio(self) -> float:
        return self.batch16_tok_s / self.batch1_tok_s

    def table_row(self) -> TableRow:
        return TableRow("decode throughput scaling",
                        f"batch 1: {self.batch1_tok_s:.0f} tok/s, batch 16: "
                        f"{self.batch16_tok_s:.0f} tok/s ({self.tokens} tokens, "
                        f"{self.kernels} kernels)",
                        self.ratio, "batch-16 / batch-1 decode tokens/s")


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


def measure(tokens: int = 64, kernels: str = "torch") -> DecodeThroughput:
    engine = Engine(EngineConfig(kernels=kernels, prefix_cache=False))
    decode_rate(engine, 1, 4)  # warm-up
    r1 = decode_rate(engine, 1, tokens)
    r16 = decode_rate(engine, 16, tokens)
    return DecodeThroughput(tokens, kernels, r1, r16)


def report(res: DecodeThroughput) -> None:
    print(f"decode tokens/s  batch1 {res.batch1_tok_s:8.1f}  batch16 {res.batch16_tok_s:8.1f}  "
          f"ratio {res.ratio:5.2f}x")


def main(argv: list[str] | None = None) -> DecodeThroughput:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--kernels", default="torch")
    args = ap.parse_args(argv)
    res = measure(args.tokens, args.kernels)
    report(res)
    return res


if __name__ == "__main__":
    main()
