"""Workbench probes against a real PD pair on loopback: launch, load, dump/diff, queues, CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import polars as pl
import pytest

from workbench import diff_against_reference, dump_buffers, inject_concurrency, launch_pd_pair
from workbench.deploy import LaunchError
from workbench.deploy.launch import EMBEDDED, TemplateBackend
from workbench.observe import BufferDump, QueueSampler, ReferenceBuffers

pytestmark = [pytest.mark.slow, pytest.mark.servers, pytest.mark.nixl]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    with launch_pd_pair(engine={"debug_capture": 16},
                        log_dir=tmp_path_factory.mktemp("logs")) as p:
        yield p


def test_load_dump_and_diff_on_a_clean_pair(pair, tmp_path):
    with QueueSampler(pair, interval_s=0.1) as sampler:
        res = inject_concurrency(pair, sessions=2, turns=1, seed=5, max_tokens=60,
                                 capture_dir=tmp_path, progress=False)
    df = res.requests
    assert set(df.columns) >= {"session", "turn", "room", "ttft_s", "itl_s", "e2e_s", "flagged"}
    assert res.summary.ref_mismatch == 0 and res.captures == ()
    queues = sampler.frame()
    assert set(queues["queue"]) >= {"prealloc", "transfer", "bootstrap", "inflight"}
    room = int(df["room"][0])
    cfg = pair.spec.engine_config()
    for role in ("decode", "prefill"):
        dump = dump_buffers(pair, room=room, role=role)
        assert len(dump.tokens) > 100 and "layer3.index_k_f32" in dump.tensors
        ident = dump.identity  # whose dump: the client's prompt, one request named the room
        assert ident.prompt_hash == df["prompt_hash"][0] and ident.rid == f"room-{room}"
        assert ident.room_requests == ((ident.rid, ident.prompt_hash),)
        diff = diff_against_reference(dump, cfg)
        assert diff.first_bad_layer is None and (diff.summary["max_abs"] == 0).all()


def test_diff_localizes_a_corrupted_layer_and_position(pair):
    room = int(inject_concurrency(pair, sessions=1, turns=1, seed=9, max_tokens=40,
                                  progress=False).requests["room"][0])
    dump = dump_buffers(pair, room=room, what=("index_k",))
    tensors = dict(dump.tensors)
    bad = tensors["layer2.index_k_f32"].clone()
    bad[57:] += 0.5
    tensors["layer2.index_k_f32"] = bad
    diff = diff_against_reference(BufferDump("tampered", dump.tokens, tensors),
                                  ReferenceBuffers(pair.spec.engine_config()))
    assert (diff.first_bad_layer, diff.first_bad_position) == (2, 57)
    row = diff.summary.filter(pl.col("layer") == 2).row(0, named=True)
    assert row["bad_positions"] == len(dump.tokens) - 57


def test_failed_launch_is_typed_and_names_the_process(tmp_path):
    broken = TemplateBackend("broken", prefill=EMBEDDED.prefill,
                             decode=sys.executable + " -c 'import sys; print(\"boom\"); "
                                                     "sys.exit(3)' {port}")
    with pytest.raises(LaunchError, match="decode0 exited with 3(.|\n)*boom"):
        launch_pd_pair(backend=broken, log_dir=tmp_path)


def test_unknown_variant_fails_before_launching():
    with pytest.raises(KeyError, match="valid: abort_orphan_transfer_entry"):
        launch_pd_pair(patches=["no_such_patch"])


def test_cli_up_load_dump(tmp_path):
    state = tmp_path / "pair.json"
    up = subprocess.Popen([sys.executable, "-m", "workbench.cli", "up", "--state", str(state),
                           "--engine", "debug_capture=8", "--hold-s", "240"])
    try:
        deadline = time.monotonic() + 180
        while not state.exists() and time.monotonic() < deadline and up.poll() is None:
            time.sleep(0.5)
        assert state.exists(), "wb up did not write its state file"
        out = tmp_path / "load.parquet"
        subprocess.run([sys.executable, "-m", "workbench.cli", "load", "--state", str(state),
                        "--workload", "smoke", "--sessions", "1", "--max-tokens", "40", "--out",
                        str(out)], check=True, timeout=300)
        df = pl.read_parquet(out)
        assert len(df) >= 1 and df["v_ref_match"].all()
        dump = tmp_path / "room.safetensors"
        subprocess.run([sys.executable, "-m", "workbench.cli", "dump", "--state", str(state),
                        "--room", str(df["room"][0]), "--out", str(dump), "--diff"],
                       check=True, timeout=300)
        summary = pl.read_parquet(dump.with_suffix(".diff.parquet"))
        assert summary["bad_positions"].sum() == 0
        assert json.loads(state.read_text())["router"].startswith("http://127.0.0.1:")
    finally:
        up.terminate()
        up.wait(timeout=60)
