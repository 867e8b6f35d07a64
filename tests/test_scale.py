"""Where work runs: the same search gives the same answer in process and on a two-node Ray
cluster, whatever finished first; the first failure is the lowest failing seed."""

from __future__ import annotations

import sys
import time

import pytest
from ray import cloudpickle

from workbench import sim
from workbench.scale import Executor, Placement, executor_for

pytestmark = [pytest.mark.slow, pytest.mark.ray]
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import tests


def jittered_square(x: int) -> int:
    time.sleep((x * 7919 % 13) / 200)  # later items often finish first
    return x * x


def is_bad(y: int) -> bool:
    return y % 7 == 2  # 9, 16, ...: the first is x=3


def test_the_default_search_does_not_wait_for_a_cluster(monkeypatch):
    """With nothing asked, a quick simulation finds its failing seed in process."""
    import ray

    if ray.is_initialized():
        pytest.skip("a Ray cluster of an earlier test is up in this process")
    monkeypatch.delenv("PDWB_WORKERS", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    race = ("bf16_index_k", "hicache_index_k_no_wait")
    found = sim.explore(race, range(20), progress=False)
    assert found.failures and not ray.is_initialized()


def test_map_keeps_item_order_and_cuts_at_the_lowest_failure(ray_cluster):
    items = list(range(40))
    here = Executor(Placement(workers=1))
    there = executor_for(address=ray_cluster)
    assert there.workers == 2
    assert here.map(jittered_square, items) == there.map(jittered_square, items, chunk=3)
    cut_here = here.map(jittered_square, items, failed=is_bad, stop=True)
    cut_there = there.map(jittered_square, items, failed=is_bad, stop=True)
    assert cut_here == cut_there == [0, 1, 4, 9]


def test_a_staged_map_runs_here_first_then_on_ray_with_the_same_result(ray_cluster):
    """``local_first_s``: the items run in process until that long has passed, the rest on the
    (already running) cluster; order and the cut at the lowest failure are kept either way."""
    items = list(range(40))
    here = Executor(Placement(workers=1)).map(jittered_square, items)
    staged = Executor(Placement(address=ray_cluster, local_first_s=0.05))
    assert not staged.connected
    assert staged.map(jittered_square, items, chunk=3) == here and staged.connected
    quick = Executor(Placement(address=ray_cluster, local_first_s=30.0))
    assert quick.map(jittered_square, items, failed=is_bad, stop=True) == [0, 1, 4, 9]
    assert not quick.connected  # the failure came first: no cluster was asked for


def test_an_exploration_is_identical_on_one_worker_and_on_two_nodes(ray_cluster):
    race, kw = ("bf16_index_k", "hicache_index_k_no_wait"), dict(progress=False)
    ex = executor_for(address=ray_cluster)
    ex.nodes.clear()
    small = sim.Workload(sessions=2, max_tokens=16)  # too short for the race to show
    here = sim.explore(race, range(8), small, workers=1, stop_on_failure=False, **kw)
    there = sim.explore(race, range(8), small, address=ray_cluster, stop_on_failure=False, **kw)
    assert len(ex.nodes) == 2, "both nodes ran schedules"
    assert [(r.seed, r.fingerprint, r.tokens, r.failed, r.anomalies) for r in here.runs] == \
        [(r.seed, r.fingerprint, r.tokens, r.failed, r.anomalies) for r in there.runs]
    assert len(there.runs) == 8 and not there.failures
    w = sim.Workload(sessions=2)  # every schedule fails: later seeds finish, seed 0 is reported
    first_here = sim.explore(race, range(6), w, workers=1, **kw).first_failure
    found = sim.explore(race, range(6), w, address=ray_cluster, **kw)
    assert [r.seed for r in found.runs] == [first_here.seed] == [0]
    assert found.first_failure.fingerprint == first_here.fingerprint
    assert sim.replay(found.first_failure).tokens == first_here.tokens


DRIVER = """
import json, sys, time
from pathlib import Path
from workbench.drive import cell_of
from workbench.investigate.fleet import Deployment, DeploymentSpec
from workbench.scale import executor_for
ex = executor_for(address=sys.argv[1])
spec = DeploymentSpec(cell_of("baseline"), judge=0, log_dir=Path(sys.argv[2]),
                      source=Path.cwd(), bind=True)
actors = [ex.actor(Deployment, spec) for _ in range(2)]
print(json.dumps([a.call("pids") for a in actors]), flush=True)
time.sleep(600)
"""


@pytest.mark.servers
def test_killing_the_driver_leaves_no_server_behind(ray_cluster, tmp_path):
    import json
    import os
    import signal
    import subprocess

    import psutil

    driver = subprocess.Popen([sys.executable, "-c", DRIVER, ray_cluster, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        first, second = json.loads(driver.stdout.readline() or "[[], []]")
        assert len(first) == len(second) == 3 and all(map(_alive, first + second))
        os.kill(psutil.Process(first[0]).ppid(), signal.SIGKILL)  # an actor dies, no atexit
        assert _gone(first), "servers outlived their actor"
        assert all(map(_alive, second)), "the other deployment is untouched"
        os.kill(driver.pid, signal.SIGKILL)  # the driver dies: Ray ends its actors
        driver.wait(timeout=30)
        assert _gone(second), "servers outlived their driver"
    finally:
        if driver.poll() is None:
            driver.kill()


def _gone(pids: list[int], wait_s: float = 120.0) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(map(_alive, pids)):
        time.sleep(0.5)
    return not any(map(_alive, pids))


def _alive(pid: int) -> bool:
    import psutil
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
