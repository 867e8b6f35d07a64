"""What CPU instruction set the vLLM side environment uses on this host (notebook 08).

vLLM's CPU attention chooses its AMX kernel from CPUID alone (``torch.cpu._is_amx_tile_supported``)
for bf16, while Linux lets a process execute AMX tile instructions only after it asked for tile
state (``arch_prctl(ARCH_REQ_XCOMP_PERM)``; PyTorch's ``torch._C._cpu._init_amx``); without the
grant the first tile instruction is SIGILL. ``isa_probe()`` reads both in a fresh process of the
side environment, as a vLLM worker starts.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass

PROBE = """
import json, pathlib, torch
out = {"amx_advertised": torch.cpu._is_amx_tile_supported(),
       "avx512": torch.cpu._is_avx512_supported(),
       "amx_permitted": bool(torch._C._cpu._init_amx())}
import vllm
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
out["attn_isa_bf16"] = _get_attn_isa(torch.bfloat16, 128, 32)
out["attn_isa_f32"] = _get_attn_isa(torch.float32, 128, 32)
root = pathlib.Path(vllm.__file__).parent
out["vllm_calls_init_amx"] = sum("_init_amx" in p.read_text(errors="replace")
                                 for p in root.rglob("*.py"))
print(json.dumps(out))
"""


@dataclass(frozen=True)
class IsaProbe:
    """What the vLLM environment decides on this host. ``amx_advertised``: CPUID says AMX tiles
    (what ``torch.cpu._is_amx_tile_supported`` and vLLM's ISA choice read); ``amx_permitted``:
    the kernel granted this process AMX tile state (``arch_prctl(ARCH_REQ_XCOMP_PERM)``, which
    Linux requires before the first tile instruction, else SIGILL); ``attn_isa_*``: the CPU
    attention kernel vLLM picks for bf16 / float32 (head size 32, block 128, as served here);
    ``vllm_calls_init_amx``: vLLM source files that ask for that permission."""

    amx_advertised: bool
    avx512: bool
    amx_permitted: bool
    attn_isa_bf16: str
    attn_isa_f32: str
    vllm_calls_init_amx: int

    @property
    def predicts_sigill(self) -> bool:
        """vLLM runs its AMX kernel without the tile permission having been granted."""
        return self.attn_isa_bf16 == "amx" and not self.amx_permitted


def isa_probe(timeout_s: float = 300.0) -> IsaProbe:
    """Runs ``PROBE`` in the vLLM side environment (a fresh process, as a worker is)."""
    from workbench.deploy.vllm import vllm_python

    out = subprocess.run([str(vllm_python()), "-c", PROBE], capture_output=True, text=True,
                         timeout=timeout_s, check=True)
    return IsaProbe(**json.loads(out.stdout.strip().splitlines()[-1]))
