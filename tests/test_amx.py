"""The AMX tile-state grant the vLLM site hook makes (issue 36): read without requesting, asked
for only where CPUID advertises AMX, and on an AMX host the difference between a tile
instruction that runs and a SIGILL. The mechanism tests need an AMX host and skip elsewhere with
that reason; the read-only tests run on any x86-64 Linux."""

from __future__ import annotations

import platform
import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workbench" / "deploy" / "vllm_site"))
import pdwb_amx  # noqa: E402

from workbench.studies.crash_study import host  # noqa: E402

TILE = Path(__file__).parent / "support" / "amx_tile.py"
X86_LINUX = platform.system() == "Linux" and platform.machine() == "x86_64"
needs_x86 = pytest.mark.skipif(not X86_LINUX, reason="arch_prctl is x86-64 Linux only")
needs_amx = pytest.mark.skipif(not pdwb_amx.advertised(),
                               reason=f"this host's CPU ({host().cpu}) does not advertise AMX")


def child(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=60)


@needs_x86
def test_reading_the_permission_never_grants_it():
    site = str(TILE.parents[2] / "workbench" / "deploy" / "vllm_site")
    code = (f"import sys; sys.path.insert(0, {site!r}); import pdwb_amx as a; "
            "print(a.permitted(), a.permitted(), a.supported())")
    first, second, supported = child("-c", code).stdout.split()
    assert first == second  # reading gives no grant
    assert first == "False" or pdwb_amx.advertised()
    assert supported == str(pdwb_amx.advertised())


@needs_x86
def test_the_hook_asks_only_where_amx_is_advertised_and_can_be_turned_off():
    off = pdwb_amx.install_from_env({pdwb_amx.GRANT_ENV: "0"})
    assert off == ("off" if pdwb_amx.advertised() else "no-amx")
    assert pdwb_amx.report()["hook"] == off


@needs_x86
@needs_amx
def test_a_tile_instruction_without_the_grant_is_sigill_and_with_it_runs():
    bare, granted = child(str(TILE), "nogrant"), child(str(TILE), "grant")
    assert bare.returncode == -signal.SIGILL, bare.stdout + bare.stderr
    assert bare.stdout.split()[:2] == ["off", "False"]
    assert granted.returncode == 0, granted.stdout + granted.stderr
    assert granted.stdout.split()[:2] == ["granted", "True"]
    assert "tile instruction ran" in granted.stdout
