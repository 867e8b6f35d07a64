"""What CPU instruction set the vLLM side environment uses on this host (notebook 08).

vLLM's CPU attention chooses its AMX kernel from CPUID alone (``torch.cpu._is_amx_tile_supported``)
for bf16, while Linux lets a process execute AMX tile instructions only after it asked for tile
state (``arch_prctl(ARCH_REQ_XCOMP_PERM)``); without the grant the first tile instruction is
SIGILL. The launcher's site hook asks in every vLLM process (``vllm_site/pdwb_amx.py``, switch
``VllmOptions.amx_grant``). Both probes here *read* the permission (``ARCH_GET_XCOMP_PERM``) and
never request it, so they report what vLLM holds, not what the probe was just given:
``isa_probe()`` in a fresh process of the side environment under the servers' site hook, and
``worker_amx(pair)`` inside each running worker (``/collective_rpc``).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass

PROBE = """
import json, pathlib
import pdwb_amx
start = pdwb_amx.report()
import torch, vllm
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
root = pathlib.Path(vllm.__file__).parent
print(json.dumps({
    "amx_advertised": torch.cpu._is_amx_tile_supported(),
    "avx512": torch.cpu._is_avx512_supported(),
    "amx_supported": start["supported"], "amx_permitted": start["permitted"],
    "amx_permitted_after_import": pdwb_amx.permitted(), "grant": start["hook"],
    "attn_isa_bf16": _get_attn_isa(torch.bfloat16, 128, 32),
    "attn_isa_f32": _get_attn_isa(torch.float32, 128, 32),
    "vllm_calls_init_amx": sum("_init_amx" in p.read_text(errors="replace")
                               for p in root.rglob("*.py"))}))
"""
AMX_REPORT = "pdwb_amx_report"  # the worker extension's method (vllm_site/pdwb_worker.py)


@dataclass(frozen=True)
class IsaProbe:
    """What a fresh vLLM process decides on this host. ``amx_advertised``: CPUID says AMX tiles
    (what vLLM's ISA choice reads); ``amx_supported``: the kernel can grant tile state;
    ``amx_permitted``: the process holds the grant after the site hook and before any import
    (``grant``: what the hook did: ``granted``, ``refused``, ``off``, ``no-amx``);
    ``amx_permitted_after_import``: after importing torch and vLLM (oneDNN may ask on its own);
    ``attn_isa_*``: the CPU attention kernel vLLM picks for bf16 / float32 (head size 32, block
    128, as served here); ``vllm_calls_init_amx``: vLLM source files that ask for permission.
    None: the kernel could not say (not x86-64 Linux)."""

    amx_advertised: bool
    avx512: bool
    amx_supported: bool | None
    amx_permitted: bool | None
    amx_permitted_after_import: bool | None
    grant: str
    attn_isa_bf16: str
    attn_isa_f32: str
    vllm_calls_init_amx: int

    @property
    def predicts_sigill(self) -> bool:
        """vLLM would run its AMX kernel in a process that does not hold the tile permission."""
        return self.attn_isa_bf16 == "amx" and self.amx_permitted_after_import is not True


@dataclass(frozen=True)
class WorkerAmx:
    """One running vLLM worker's AMX tile permission, read inside it: ``server`` (the pair's
    process name), ``pid``, ``permitted`` (None: the kernel could not say), ``hook`` (what the
    site hook did there), ``error``: why the worker could not be asked."""

    server: str
    pid: int | None
    permitted: bool | None
    hook: str
    error: str = ""


def isa_probe(grant: bool = True, timeout_s: float = 300.0) -> IsaProbe:
    """Runs ``PROBE`` in the vLLM side environment (a fresh process under the servers' site
    hook, with the AMX grant on or off as a launch with ``VllmOptions(amx_grant=grant)``)."""
    import os

    from workbench.deploy.vllm import VllmOptions, site_env, vllm_python

    env = {**os.environ, **site_env(VllmOptions(amx_grant=grant))}
    out = subprocess.run([str(vllm_python()), "-c", PROBE], capture_output=True, text=True,
                         timeout=timeout_s, check=True, env=env)
    return IsaProbe(**json.loads(out.stdout.strip().splitlines()[-1]))


def worker_amx(servers: dict[str, str], timeout_s: float = 30.0) -> list[WorkerAmx]:
    """The AMX permission inside every worker of each vLLM server (name -> URL); a server that
    does not answer gives one row with its ``error``, never an exception."""
    import httpx

    from workbench.deploy.vllm import worker_rpc

    out = []
    for name, url in servers.items():
        try:
            rows = worker_rpc(url, AMX_REPORT, timeout_s)
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            out.append(WorkerAmx(name, None, None, "", f"{type(exc).__name__}: {exc}"))
            continue
        out += [WorkerAmx(name, r.get("pid"), r.get("permitted"), str(r.get("hook")))
                for r in rows]
    return out
