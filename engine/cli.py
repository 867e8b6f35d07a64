"""``python -m engine {serve,train,eval}``: the engine's command line."""

from __future__ import annotations

import argparse
import json
import logging

from engine.config import ConfigError, EngineConfig


def parse_overrides(pairs: list[str]) -> dict:
    """``key=value`` pairs; values parse as JSON when they can (numbers, booleans), else strings."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"expected key=value, got {pair!r}")
        try:
            out[key.replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            out[key.replace("-", "_")] = value
    return out


def serve(argv: list[str]) -> None:
    import uvicorn

    from engine.engine import Engine
    from engine.server import create_app

    ap = argparse.ArgumentParser(prog="engine serve")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="EngineConfig overrides, e.g. index_k_dtype=bf16 kernels=triton")
    args = ap.parse_args(argv)
    cfg = EngineConfig.from_dict(parse_overrides(args.set))
    engine = Engine(cfg)
    engine.start()
    try:
        uvicorn.run(create_app(engine), host=args.host, port=args.port, log_level="warning")
    finally:
        engine.stop()


def main(argv: list[str] | None = None) -> None:
    import sys

    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    commands = {"serve": serve}
    if not argv or argv[0] not in {*commands, "train", "eval"}:
        raise SystemExit("usage: python -m engine {serve,train,eval} ...")
    if argv[0] == "train":
        from engine.train import main as train_main

        return train_main(argv[1:])
    if argv[0] == "eval":
        from engine.evaluate import main as eval_main

        return eval_main(argv[1:])
    return commands[argv[0]](argv[1:])
