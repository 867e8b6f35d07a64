"""The workbench against a real engine: vLLM prefill + decode over NIXL behind vllm-router
(issue 12). Needs the pinned side environment (``make vllm-env``; ``make test`` builds it)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import polars as pl
import pytest

from workbench import dump_buffers, inject_concurrency, investigate, launch_pd_pair
from workbench.backends import Capability, MissingCapability
from workbench.metrics import MetricsSampler, drain_check, gauges, scrape
from workbench.queues import QueueSampler
from workbench.solo import solo_reference
from workbench.vllm import MODEL_DIR

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]

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


def test_vllm_pd_pair_serves_tool_calls_parsed_by_vllm_over_nixl(pair):
    """Structured tool_calls come from vLLM's own deepseek_v32 parser; KV moved over NIXL (the
    decode's nixl transfer histogram counts them); the solo reference judges every response."""
    names = {"vllm:num_requests_running", "vllm:num_requests_waiting",
             "vllm:kv_cache_usage_perc", "vllm:nixl_xfer_time_seconds_count"}
    with MetricsSampler(pair, interval_s=0.5, names=names) as sampler:
        res = inject_concurrency(pair, sessions=8, turns=2, seed=0, progress=False)
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
    assert solo.judged == s.completed and solo.baseline_runs == solo.prompts
    assert solo.baseline_mismatches == 0  # greedy vLLM on CPU is deterministic alone
    assert not solo.beyond_baseline, solo.requests.filter(~pl.col("solo_match"))


def test_kill_storm_then_drain_is_measured_from_metrics(pair):
    baseline = gauges(pair)
    assert set(baseline["name"]) >= {"vllm:num_requests_running", "vllm:kv_cache_usage_perc"}
    killed = investigate.kill_storm(pair, n=12, kill_at_s=0.2, seed=1, max_tokens=160)
    assert killed >= 6
    report = drain_check(pair, baseline, timeout_s=30)
    assert set(report.last["role"]) == {"prefill", "decode"}
    assert report.settled, report.leftovers  # vLLM frees aborted requests' blocks
    assert investigate.wedge_probe(pair, timeout_s=60)


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
