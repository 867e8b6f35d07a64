"""``python -m engine.router``: the router's command line."""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal

from engine.http import SECRET_ENV
from engine.patch_set import PatchSet
from engine.router.app import create_app
from engine.router.state import POLICIES, RouterConfig

log = logging.getLogger("engine.router")


def main(argv: list[str] | None = None) -> None:
    """``python -m engine.router``."""
    from engine.http.timeouts import run_server

    ap = argparse.ArgumentParser(prog="engine.router", description="PD router: one "
                                 "OpenAI-compatible front door over prefill/decode pools")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--prefill", nargs="+", required=True, metavar="URL")
    ap.add_argument("--decode", nargs="+", required=True, metavar="URL")
    ap.add_argument("--seed", type=int, default=None, help="seeds the random policy, so "
                    "server picks replay (rooms are always unpredictable)")
    ap.add_argument("--debug-token", default=os.environ.get("PDWB_DEBUG_TOKEN"),
                    help="X-Debug-Token for /debug/* (prefer $PDWB_DEBUG_TOKEN: argv is public)")
    ap.add_argument("--debug-open", action="store_true",
                    help="serve /debug/rooms to any loopback caller without a token")
    ap.add_argument("--policy", default="round_robin", help=f"one of {POLICIES.names()}")
    ap.add_argument("--timeout-s", type=float, default=300.0, help="per upstream operation")
    ap.add_argument("--history", type=int, default=4096, help="rooms kept for /debug/rooms")
    ap.add_argument("--health-interval-s", type=float, default=1.0,
                    help="probe upstream /health this often; unhealthy servers get no requests "
                         "until they answer again (0: never probe)")
    ap.add_argument("--patches", default="",
                    help="comma-separated patch variants (engine.patches) the router runs with; "
                    "a launch passes a pair's patches to every process this way")
    args = ap.parse_args(argv)
    try:
        cfg = RouterConfig(tuple(args.prefill), tuple(args.decode), args.seed, args.policy,
                           args.timeout_s, args.history, debug_token=args.debug_token,
                           debug_open=args.debug_open, health_interval_s=args.health_interval_s,
                           secret=os.environ.get(SECRET_ENV) or None,
                           patches=PatchSet.parse(args.patches).enabled)
    except (KeyError, ValueError) as exc:
        ap.error(str(exc))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    log.info("router on %s:%d: %s", args.host, args.port, cfg)
    faulthandler.register(signal.SIGUSR2, all_threads=False)  # stacks for a watcher (SIGUSR2)
    run_server(create_app(cfg), args.host, args.port, timeout_graceful_shutdown=2)

