"""The workbench against a real engine: vLLM prefill + decode over NIXL behind vllm-router
(issue 12). Needs the pinned side environment (``make vllm-env``; ``make test`` builds it).

On some hosts a vLLM worker dies on its own (SIGILL on AMX-capable Intel guests, issue 26): a
test whose pair died asserts the death was recorded in full (process, signal, time, the load's
rows naming it) and is reported as xfail with the death, so the suite neither fails at random
nor hides it."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
import warnings
from pathlib import Path

import polars as pl
import pytest

from workbench import dump_buffers, inject_concurrency, launch_pd_pair
from workbench.deploy import Capability, EngineDied, MissingCapability, lasting
from workbench.deploy.isa import isa_probe, worker_amx
from workbench.deploy.vllm import MODEL_DIR
from workbench.drive import kill_storm, solo_reference, wedge_probe
from workbench.observe import (
    MetricsSampler,
    QueueSampler,
    drain_check,
    gauges,
    scrape,
    transfer_stats,
)
from workbench.studies.storm import StormConfig, findings, run_storm

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.servers, pytest.mark.nixl]
ROOT = Path(__file__).resolve().parents[1]


def pdwb_amx_advertised() -> bool:
    return "amx_tile" in Path("/proc/cpuinfo").read_text()

TEMPLATE_CHECK = """
import copy, json, sys
sys.path.insert(0, {root!r})
from transformers import AutoTokenizer
from engine.text.chat import render_prompt
from engine.training.datagen import make_transcript
tk = AutoTokenizer.from_pretrained({model!r})
bad = []
for seed in range(150):
    tr = make_transcript(seed)
    for upto in range(len(tr.rounds)):
        msgs = tr.messages(upto_round=upto)
        want = render_prompt(msgs, list(tr.tools))
        msgs = copy.deepcopy(msgs)  # vLLM hands templates decoded arguments
        for m in msgs:
            for c in m.get("tool_calls") or []:
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
        got = tk.apply_chat_template(msgs, tools=[t.to_openai() for t in tr.tools],
                                     tokenize=False, add_generation_prompt=True)
        if got != want:
            bad.append(seed)
print(json.dumps({{"bad": bad}}))
"""


def test_chat_template_renders_like_our_engine(vllm_env):
    """transformers' Jinja rendering of the exported template == engine.text.chat, byte for
    byte, on 150 transcripts at every round (what vLLM feeds the model is what it was trained
    on)."""
    out = subprocess.run([str(vllm_env), "-c", TEMPLATE_CHECK.format(root=str(ROOT),
                                                                     model=str(MODEL_DIR))],
                         capture_output=True, text=True, timeout=300, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"bad": []}


@pytest.fixture(scope="module")
def pair(vllm_env, tmp_path_factory):
    with launch_pd_pair(backend="vllm", log_dir=tmp_path_factory.mktemp("vllm-pair")) as p:
        yield p


def xfail_if_died(pair, load=None) -> None:
    """When a process of ``pair`` died or hangs: checks the record is complete (and, given the
    load that met it, that its failed requests name it), then xfails with the evidence."""
    down = lasting(pair.down())
    if not down:
        return
    for o in down:
        assert o.process and o.at, o
        if isinstance(o, EngineDied):
            assert o.signal or o.exit_code is not None or o.log_tail, o
    if load is not None:
        failed = load.requests.filter((pl.col("error") != "") & ~pl.col("killed"))
        assert (failed["engine_down"] != "").all(), failed.select("error", "engine_down")
    pytest.xfail("the vLLM pair lost a process (recorded): "
                 + "; ".join(o.describe() for o in down))


def test_vllm_pd_pair_serves_tool_calls_parsed_by_vllm_over_nixl(pair):
    """Structured tool_calls come from vLLM's own deepseek_v32 parser; KV moved over NIXL (the
    decode's nixl transfer histogram counts them); the solo reference judges every response."""
    xfail_if_died(pair)
    names = {"vllm:num_requests_running", "vllm:num_requests_waiting",
             "vllm:kv_cache_usage_perc", "vllm:nixl_xfer_time_seconds_count"}
    with MetricsSampler(pair, interval_s=0.5, names=names) as sampler:
        res = inject_concurrency(pair, sessions=8, turns=2, seed=0, progress=False)
    xfail_if_died(pair, res)
    s = res.summary
    errors = res.requests["error"].drop_nulls().unique().to_list()[:3]
    assert s.errors == 0 and s.completed == s.requests >= 24, (s, errors)  # 1-4 rounds each
    calls = res.requests.filter(pl.col("kind") == "call")
    well = calls["v_well_formed"].sum() / len(calls)
    assert well >= 0.95, calls.select("content", "tool_calls")
    assert calls["v_args_ok"].sum() >= 0.9 * len(calls)
    assert res.requests["token_ids"].map_elements(
        lambda t: bool(json.loads(t)), return_dtype=pl.Boolean).all()  # ids via return_token_ids

    series = sampler.frame()
    assert set(series["role"]) == {"prefill", "decode"}
    xfers = sum(s.value for s in scrape(pair.decode[0].url)
                if s.name == "vllm:nixl_xfer_time_seconds_count")
    assert xfers >= s.requests, f"decode counted {xfers} NIXL transfers for {s.requests} requests"

    solo = solo_reference(pair, res, repeats=2, progress=False)
    xfail_if_died(pair)
    assert solo.judged == s.completed and solo.baseline_runs == solo.prompts
    assert solo.baseline_mismatches == 0  # greedy vLLM on CPU is deterministic alone
    assert not solo.beyond_baseline, solo.requests.filter(~pl.col("solo_match"))


def test_feature_oracles_on_vllm_are_recorded_as_measured(pair, tmp_path):
    """Requests as clients send them (the ``clients`` dialect) on the real vLLM pair: the
    oracles that need no greedy reference (usage, top-1, seed replayed alone) judge its answers
    and what they found is recorded as a finding, whichever way it fell."""
    from workbench.judge import read_findings, record_drafts
    from workbench.studies import api

    xfail_if_died(pair)
    res = inject_concurrency(pair, sessions=4, turns=2, seed=0, dialect="clients",
                             progress=False)
    xfail_if_died(pair, res)
    table = api.oracle_table(res)
    judged = dict(zip(table["oracle"], table["judged"], strict=True))
    assert judged["usage"] > 0 and judged["seed"] > 0, table
    ledger = tmp_path / "findings.jsonl"
    (finding,) = record_drafts(api.feature_findings(res, "vLLM PD pair"), ledger=ledger,
                               source="test_vllm")
    assert finding.held and "usage" in finding.title
    assert read_findings(ledger).height == 1


def test_every_worker_reports_its_amx_permission_read_inside_it(pair):
    """The worker extension answers ``/collective_rpc`` from inside each worker: the site hook
    asked for AMX tile state where CPUID advertises AMX (so vLLM's AMX kernel cannot SIGILL) and
    did nothing elsewhere; the fresh-process probe agrees and predicts no SIGILL with the grant,
    while without it it predicts one exactly where vLLM picks its AMX kernel."""
    xfail_if_died(pair)
    workers = worker_amx({s.name: s.url for s in (*pair.prefill, *pair.decode)})
    assert {w.server for w in workers} == {"prefill0", "decode0"}, workers
    assert all(not w.error and w.pid for w in workers), workers
    amx = pdwb_amx_advertised()
    assert all(w.hook == ("granted" if amx else "no-amx") for w in workers), workers
    assert all(w.permitted is amx for w in workers), workers
    granted, bare = isa_probe(grant=True), isa_probe(grant=False)
    assert granted.grant == ("granted" if amx else "no-amx") and not granted.predicts_sigill
    assert bare.amx_permitted is False  # the probe reads; it never asks
    assert bare.predicts_sigill == (bare.attn_isa_bf16 == "amx"
                                    and bare.amx_permitted_after_import is False)


def test_kill_storm_then_drain_is_measured_from_metrics(pair):
    xfail_if_died(pair)
    baseline = gauges(pair)
    assert set(baseline["name"]) >= {"vllm:num_requests_running", "vllm:kv_cache_usage_perc"}
    killed = kill_storm(pair, n=12, kill_at_s=0.2, seed=1, max_tokens=160)
    assert killed >= 6
    report = drain_check(pair, baseline, timeout_s=30)
    xfail_if_died(pair)
    assert set(report.last["role"]) == {"prefill", "decode"}
    assert report.settled, report.leftovers  # vLLM frees aborted requests' blocks
    assert wedge_probe(pair, timeout_s=60)


def test_probes_needing_our_debug_routes_raise_typed_errors(pair):
    with pytest.raises(MissingCapability, match="BUFFER_DUMPS"):
        dump_buffers(pair, room=1)
    with pytest.raises(MissingCapability, match="DEBUG_QUEUES"):
        pair.debug("/debug/queues")
    with pytest.raises(MissingCapability, match="DEBUG_QUEUES"):
        with QueueSampler(pair):
            pass
    with pytest.raises(MissingCapability, match="BUFFER_DUMPS"):
        inject_concurrency(pair, sessions=1, capture_dir=pair.log_dir / "cap", progress=False)
    assert Capability.METRICS in pair.backend.capabilities


def test_launch_rejects_embedded_options_for_vllm():
    with pytest.raises(ValueError, match="vllm backend takes no patches"):
        launch_pd_pair(backend="vllm", patches=["bf16_index_k"])
    with pytest.raises(KeyError, match="valid: embedded, openai, vllm"):
        launch_pd_pair(backend="sglang-server")


def _died(pair) -> dict:
    return {o.pid: o for o in pair.down() if isinstance(o, EngineDied)}


def _dead(proc) -> bool:
    try:
        return proc.status() == "zombie"
    except Exception:  # noqa: BLE001 - psutil.NoSuchProcess: gone
        return True


def _active(url: str) -> float:
    try:
        return sum(s.value for s in scrape(url)
                   if s.name in ("vllm:num_requests_running", "vllm:num_requests_waiting"))
    except Exception:  # noqa: BLE001 - a server between states reads as idle
        return 0.0


def test_vllm_workers_killed_mid_load_are_recorded_and_no_probe_raises(pair):
    """SIGSEGV to the decode's worker and SIGKILL to the prefill's, once the decode runs a
    request: the run completes, the report names both processes with their signals and times,
    the load's failed rows name them, later stages are skipped, and every probe still answers.
    Runs last: it leaves the module's pair dead."""
    xfail_if_died(pair)
    import psutil

    def worker(srv):
        kids = psutil.Process(srv.proc.pid).children(recursive=True)
        return next(k for k in kids if "Worker" in k.name())
    targets = [(worker(pair.decode[0]), signal.SIGSEGV), (worker(pair.prefill[0]), signal.SIGKILL)]
    fired = threading.Event()

    def kill_when_busy() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and _active(pair.decode[0].url) < 1:
            time.sleep(0.05)
        for proc, sig in targets:
            proc.send_signal(sig)
        fired.set()
    threading.Thread(target=kill_when_busy, daemon=True).start()
    t0 = time.time()
    # no client kills and three turns: requests stay in flight and queued past the deaths
    report = run_storm(pair, StormConfig(sessions=8, turns=3, kill_fraction=0.0, storm=4, seed=5))
    assert fired.is_set()
    deadline = time.monotonic() + 30  # a worker may take a while to die after the load gave up
    while time.monotonic() < deadline and any(_dead(p) and p.pid not in _died(pair)
                                              for p, _ in targets):
        time.sleep(0.5)
    died = _died(pair)
    for proc, sig in targets:
        if not _dead(proc):  # seen here once under load: SIGSEGV from kill did not end it
            warnings.warn(f"vLLM worker {proc.pid} survived {sig.name} sent by kill", stacklevel=1)
            continue
        o = died[proc.pid]
        assert "VLLM::Worker" in o.process and o.server in ("decode0", "prefill0")
        if o.signal is not None:  # the kernel's record (no proc connector: from vLLM's log)
            assert o.signal == sig.name, o
        assert t0 <= o.at <= time.time()
    assert any(o.signal for o in died.values())
    rows = report.load.requests
    failed = rows.filter((pl.col("error") != "") & ~pl.col("killed"))
    deaths = sorted(o.since for o in died.values())
    assert len(failed) and (failed["engine_down"] != "").all(), (
        deaths, rows.select("session", "turn", "kind", "status", "started_at", "ended_at"))
    health = findings(report)[0]
    assert "solo" in report.skipped and all(health.checks.values())
    assert any("VLLM::Worker" in o["process"] for o in health.evidence["observations"])
    assert not drain_check(pair, gauges(pair), timeout_s=5).settled
    assert transfer_stats(pair) is not None
    assert solo_reference(pair, report.load, progress=False).judged == 0
    assert not wedge_probe(pair, timeout_s=10)

