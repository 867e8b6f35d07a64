"""``python -m engine {serve,train,eval}``: the engine's command line."""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import secrets
import signal

from engine.config import ConfigError, EngineConfig
from engine.patches import OVERLAP


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
    from engine.http.timeouts import run_server

    ap = argparse.ArgumentParser(prog="engine serve")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--role", choices=["single", "prefill", "decode"], default="single")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="EngineConfig overrides, e.g. index_k_dtype=bf16 patches=a,b "
                         'faults=\'{"seed": 1}\'')
    ap.add_argument("--overlap-schedule", action="store_true",
                    help=f"alias of --set patches={OVERLAP} (added to any other patches)")
    ap.add_argument("--debug-token", default=os.environ.get("PDWB_DEBUG_TOKEN"))
    ap.add_argument("--debug-open", action="store_true",
                    help="serve /debug/* to any loopback caller without a token")
    ap.add_argument("--prefill-allow", nargs="*", default=None, metavar="URL",
                    help="decode: the only prefill bootstrap addresses requests may name "
                         "(http://HOST:PORT); default any loopback address")
    ap.add_argument("--max-transfer-queue", type=int, default=32)
    ap.add_argument("--waiting-timeout-s", type=float, default=30.0,
                    help="decode: fail a room whose KV has not all arrived this long after it "
                    "entered the transfer queue")
    ap.add_argument("--bootstrap-timeout-s", type=float, default=300.0,
                    help="prefill: fail a room the decode has not preallocated this long after "
                    "it arrived (the decode may be holding it back under load)")
    args = ap.parse_args(argv)
    cfg = EngineConfig.from_dict(parse_overrides(args.set))
    if args.overlap_schedule:
        cfg = cfg.replace(patches=cfg.patches | {OVERLAP})
    engine, app = build(args, cfg)
    # a watcher asks a silent server for a stack with SIGUSR2 (workbench.deploy.watch); one thread's
    # only: dumping all threads from a handler while they run can crash the process
    faulthandler.register(signal.SIGUSR2, all_threads=False)
    engine.start()
    try:
        run_server(app, args.host, args.port)
    finally:
        engine.stop()


def build(args, cfg: EngineConfig):
    """The engine and FastAPI app of a role."""
    # unique per process: a restarted decode is a new peer with a new key, not a rebind
    name = f"{args.role}-{args.port}-{secrets.token_hex(4)}"
    debug = {"debug_open": args.debug_open}
    if args.role in ("prefill", "decode"):
        from engine.http.auth import MissingSecret, secret_from_env

        try:
            secret = secret_from_env()
        except MissingSecret as exc:
            raise SystemExit(str(exc)) from None
    if args.role == "prefill":
        from engine.disagg import PrefillEngine
        from engine.disagg.server import PrefillServer

        engine = PrefillEngine(cfg, name, bootstrap_timeout_s=args.bootstrap_timeout_s)
        return engine, PrefillServer(engine, args.debug_token, args.port, secret=secret,
                                     **debug).app
    if args.role == "decode":
        from engine.disagg import DecodeEngine
        from engine.disagg.server import DecodeServer

        engine = DecodeEngine(cfg, name, max_transfer_queue=args.max_transfer_queue,
                              waiting_timeout_s=args.waiting_timeout_s, secret=secret)
        allowed = None if args.prefill_allow is None else frozenset(args.prefill_allow)
        return engine, DecodeServer(engine, args.debug_token, args.port, secret=secret,
                                    allowed_prefills=allowed, **debug).app
    from engine.core import Engine
    from engine.serving import create_app

    engine = Engine(cfg)
    return engine, create_app(engine, args.debug_token, args.port, **debug)


def main(argv: list[str] | None = None) -> None:
    import sys

    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    commands = {"serve": serve}
    usage = "usage: python -m engine {serve,train,eval} ... (each takes --help)"
    if argv[:1] in (["-h"], ["--help"]):
        print(usage)
        return None
    if not argv or argv[0] not in {*commands, "train", "eval"}:
        raise SystemExit(usage)
    if argv[0] == "train":
        from engine.training.train import main as train_main

        return train_main(argv[1:])
    if argv[0] == "eval":
        from engine.training.evaluate import main as eval_main

        return eval_main(argv[1:])
    return commands[argv[0]](argv[1:])
