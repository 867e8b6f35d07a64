"""Executes every investigation notebook in a real Jupyter kernel with CI-sized parameters.

Each finding cell asserts its claim, so a run that no longer supports a finding fails here.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from workbench.judge import read_findings
from workbench.report import run_report

pytestmark = [pytest.mark.slow, pytest.mark.notebook, pytest.mark.servers, pytest.mark.nixl]
NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
SMALL = {
    "01_reproduce_corruption.py": {"max_bursts": 6},
    "02_localize_index_k.py": {"max_bursts": 6},
    "03_bisect_patch_series.py": {"series": ["bf16_index_k", "hicache_index_k_no_wait",
                                             "abort_orphan_transfer_entry"],
                                  "sessions": 4, "confidence": 0.8, "max_trials": 24},
    "04_wedge_vs_corruption.py": {},
    "05_investigation_template.py": {"spec": {"patches": ["chunk_prev_token_dropped"],
                                              "shapes": ["baseline"]}},
    "06_vllm_pd_kill_storm.py": {"sessions": 8, "storm": 16},
    "07_simulate_then_confirm.py": {"seeds": 10, "fixed_seeds": 3, "sessions": 4, "replays": 2},
    "08_vllm_worker_death.py": {},  # reads the committed study (data/findings), probes the ISA
}
FINDINGS = {  # findings each notebook records (all must hold)
    "01_reproduce_corruption.py": 4, "02_localize_index_k.py": 2, "03_bisect_patch_series.py": 1,
    "04_wedge_vs_corruption.py": 2, "05_investigation_template.py": 1,
    "06_vllm_pd_kill_storm.py": 5, "07_simulate_then_confirm.py": 3,
    "08_vllm_worker_death.py": 3,
}
RENDERED = {  # text each executed report must contain
    "01_reproduce_corruption.py": "flagged (95% CI upper bound",
    "02_localize_index_k.py": "first divergence: room",
    "03_bisect_patch_series.py": "culprit patch: hicache_index_k_no_wait",
    "04_wedge_vs_corruption.py": "orphan cleanup",
    "05_investigation_template.py": "diagnosis: prefill",
    "06_vllm_pd_kill_storm.py": "deployment health:",
    "07_simulate_then_confirm.py": "confirmed:",
    "08_vllm_worker_death.py": "death rate per condition",
}


# notebook 01 runs top to bottom in JupyterLab instead (tests/test_jupyterlab.py), with its views
# and its exported report checked there: the suite runs it once
PAPERMILL = sorted(set(SMALL) - {"01_reproduce_corruption.py"})


@pytest.mark.parametrize("name", PAPERMILL)
def test_notebook_executes_and_exports_html(tmp_path, name, request):
    if name.startswith(("06", "08")):
        request.getfixturevalue("vllm_env")  # the real vLLM environment (make vllm-env)
    params = dict(SMALL[name])
    if name.startswith("03"):
        params["store"] = str(tmp_path / "bisect.sqlite")
    if name.startswith("05"):
        params["spec"] = {**params["spec"], "runs_dir": str(tmp_path / "investigate")}
    if name.startswith("06"):
        params["log_dir"] = str(tmp_path / "vllm-logs")
    params["findings_ledger"] = str(tmp_path / "findings.jsonl")
    html = run_report(NOTEBOOKS / name, params, tmp_path, timeout_s=900)
    text = html.read_text()
    ledger = read_findings(params["findings_ledger"])
    if name.startswith("06") and _engine_died(ledger):
        return  # the report quotes the dead process's log, tracebacks included: evidence
    assert "Traceback" not in text
    assert RENDERED[name] in text
    assert "data:image/png;base64" in text, "plots are embedded in the report"
    assert ledger.height == FINDINGS[name] and ledger["held"].all(), ledger


def _engine_died(ledger) -> bool:
    """Notebook 06 on a host where a vLLM process died (issue 26): the run must have recorded the
    death as its first finding, in full, and claimed nothing the death cut short; the death is
    reported as a warning, not a failure (it is vLLM's, and the finding says so)."""
    first = ledger.row(0, named=True)
    if "died" not in first["title"] and "did not answer" not in first["title"]:
        return False
    assert ledger["held"].all() and ledger.height <= FINDINGS["06_vllm_pd_kill_storm.py"], ledger
    evidence = json.loads(first["evidence"])
    assert evidence["observations"] and all(o["process"] and o["at"]
                                            for o in evidence["observations"])
    warnings.warn(f"notebook 06: the vLLM pair lost a process, recorded: {first['title']}",
                  stacklevel=2)
    return True


def test_every_notebook_is_paired_and_tested():
    pys = {p.name for p in NOTEBOOKS.glob("*.py")}
    assert pys == set(SMALL) == set(RENDERED) == set(FINDINGS)
    assert all((NOTEBOOKS / n).with_suffix(".ipynb").exists() for n in pys)
