"""``wb``: the workbench probes for scripted runs; results are written as Parquet.

  wb up    --state runs/pair.json [--patches a,b] [--engine k=v ...] [--faults JSON]
           [--router embedded|sglang]
  wb load  (--state runs/pair.json | --url URL) [--workload race_burst] [--sessions 16 ...]
           [--dialect agentic] [--traffic FILE] [--record FILE] --out runs/load.parquet
  wb workloads
  wb dump  --state runs/pair.json --room R --out runs/room.safetensors [--diff]
  wb bisect --series hicache_index_k_no_wait,bf16_index_k,... --store runs/bisect.sqlite
  wb bisect --commits GOOD..BAD [--shape S --patches a,b --judge N|all --ends-budget 8]
            [--deployments K --workers N --address HOST:PORT]
  wb investigate [--source DIR --commits GOOD..BAD --judge N|all --report ...]
  wb report NOTEBOOK -p key value ...
  wb kernels --a torch --b triton --out runs/kernels.parquet [--seed 0 --cases 8]
  wb findings [--ledger runs/findings.jsonl] [--out runs/findings.parquet]
"""

from __future__ import annotations

import argparse

from workbench.cli.flags import add_spec_flags, defaults_of
from workbench.drive import LoadConfig
from workbench.investigate import bisect_patch_series
from workbench.investigate.spec import BisectSpec, InvestigationSpec

REPORTS_DIR = "reports"
LOAD_DEFAULTS = {name: getattr(LoadConfig, name) for name in
                 ("sessions", "turns", "seed", "kill_fraction", "duration_s", "max_tokens",
                  "dialect")}
"""``wb load``'s flags and their defaults: ``LoadConfig``'s (spelled there only)."""
SERIES_SHARED = ("confidence", "seed", "max_trials", "ends_budget", "store")
"""``BisectSpec`` flags that ``wb bisect --series`` passes to ``bisect_patch_series`` when
given (left out: that function's defaults)."""


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="wb", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up")
    up.add_argument("--state", default="runs/pair.json")
    up.add_argument("--patches", default="")
    up.add_argument("--engine", nargs="*", default=[], metavar="KEY=VALUE")
    up.add_argument("--faults", default="{}")
    up.add_argument("--seed", type=int, default=0)
    up.add_argument("--router", default="embedded", help="embedded (ours) or sglang")
    up.add_argument("--backend", default="embedded",
                    help="embedded (our engine) or vllm (real vLLM over NIXL, make vllm-env)")
    up.add_argument("--hold-s", type=float, default=0.0, help="stop after this long (0: never)")
    load = sub.add_parser("load")
    load.add_argument("--state")
    load.add_argument("--url")
    load.add_argument("--workload", help="a shipped workload name (wb workloads) or a file; "
                                          "the flags below override its fields")
    for name, default in LOAD_DEFAULTS.items():
        load.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=None,
                          help=f"default {default} (without --workload)")
    load.add_argument("--traffic", help="play this traffic file (JSON lines of request bodies "
                                        "with arrival offsets) instead of sessions")
    load.add_argument("--record", help="write the requests sent as a traffic file")
    load.add_argument("--no-oracle", action="store_true")
    load.add_argument("--capture-dir")
    load.add_argument("--out", default="runs/load.parquet")
    dump = sub.add_parser("dump")
    dump.add_argument("--state", required=True)
    dump.add_argument("--room", type=int, required=True)
    dump.add_argument("--role", choices=["decode", "prefill"], default="decode")
    dump.add_argument("--out", default="runs/dump.safetensors")
    dump.add_argument("--diff", action="store_true")
    bis = sub.add_parser("bisect", help="bisect a commit range (flags: BisectSpec's) or a "
                                         "patch series")
    bis.add_argument("--series", help="patch names, comma separated (candidate i enables i)")
    add_spec_flags(bis, BisectSpec, aliases={"source": "repo"}, absent_unless_given=True,
                   notes={n: f"; --series: {defaults_of(bisect_patch_series, name=n)}"
                          for n in SERIES_SHARED})
    bis.add_argument("--sessions", type=int, help="--series: sessions per burst; "
                     + defaults_of(bisect_patch_series, name="sessions"))
    demo = sub.add_parser("demo", help="the flagship investigation (notebooks 01 and 02) to HTML")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--reports-dir", default=REPORTS_DIR)
    demo.add_argument("--conversation", action="store_true",
                      help="play one agentic tool-call conversation on one server instead")
    demo.add_argument("--log-dir", help="server logs of --conversation (default: a temp dir)")
    rep = sub.add_parser("report")
    rep.add_argument("notebook")
    rep.add_argument("-p", "--param", nargs=2, action="append", default=[],
                     metavar=("KEY", "VALUE"))
    rep.add_argument("--reports-dir", default=REPORTS_DIR)
    inv = sub.add_parser("investigate", help="sweep, localize, optionally bisect; records the "
                                             "findings and writes investigation.txt")
    add_spec_flags(inv, InvestigationSpec)
    inv.add_argument("--reports-dir", default=REPORTS_DIR,
                     help="where investigation.txt and the HTML report go")
    inv.add_argument("--ledger", default="runs/findings.jsonl")
    inv.add_argument("--report", action="store_true",
                     help="also render this result with notebook 05 to HTML (needs the report "
                          "extra; the sweep is not run again)")
    ker = sub.add_parser("kernels", help="compare two kernel sets on seeded inputs")
    ker.add_argument("--a", default="torch")
    ker.add_argument("--b", default="triton")
    ker.add_argument("--seed", type=int, default=0)
    ker.add_argument("--cases", type=int, default=8)
    ker.add_argument("--out", default="runs/kernels.parquet")
    sub.add_parser("workloads", help="list the shipped workloads")
    fin = sub.add_parser("findings", help="list the recorded findings (which held, where)")
    fin.add_argument("--ledger", default="runs/findings.jsonl")
    fin.add_argument("--out", help="also write the table as Parquet")
    return ap
