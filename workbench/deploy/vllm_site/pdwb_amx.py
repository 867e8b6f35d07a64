"""AMX tile state for vLLM processes (issue 36): ask Linux for it before any tile instruction.

Linux enables AMX's TILEDATA state (XSTATE component 18) only for a process that asked for it
with ``arch_prctl(ARCH_REQ_XCOMP_PERM, 18)``; a tile instruction executed before that is fatal
(SIGILL). vLLM's CPU attention picks its AMX kernel from CPUID alone and no vLLM code asks, so a
vLLM worker on an AMX host lives only if something else in the process (oneDNN) asked first.
``install_from_env`` asks in every vLLM interpreter the workbench launches (its
``sitecustomize``), unless ``$PDWB_AMX_GRANT`` is ``0`` (the death can still be studied);
``permitted()`` reads the permission without requesting it (``ARCH_GET_XCOMP_PERM``).

Standard library only: the side environment's interpreter loads this module by name from the
site folder on its ``PYTHONPATH``. The permission is process-wide and inherited across fork().
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Mapping
from pathlib import Path

GRANT_ENV = "PDWB_AMX_GRANT"
STATE_ENV = "PDWB_AMX_HOOK"  # what the hook did in this interpreter, for a worker to report
ARCH_GET_XCOMP_SUPP = 0x1021
ARCH_GET_XCOMP_PERM = 0x1022
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18
SYS_ARCH_PRCTL = 158  # x86_64


def advertised(cpuinfo: str | Path = "/proc/cpuinfo") -> bool:
    """CPUID advertises AMX tiles (``amx_tile`` in the kernel's flags: what vLLM's ISA choice,
    ``torch.cpu._is_amx_tile_supported``, reads)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return False
    flags = next((ln.partition(":")[2].split() for ln in text.splitlines()
                  if ln.startswith("flags")), [])
    return "amx_tile" in flags


def _arch_prctl(code: int, arg: int | ctypes.c_uint64) -> int | None:
    """The syscall's return value, or None where there is no x86-64 Linux ``arch_prctl``."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ptr = ctypes.byref(arg) if isinstance(arg, ctypes.c_uint64) else ctypes.c_ulong(arg)
    return int(libc.syscall(ctypes.c_long(SYS_ARCH_PRCTL), ctypes.c_long(code), ptr))


def _mask(code: int) -> int | None:
    out = ctypes.c_uint64(0)
    return None if _arch_prctl(code, out) != 0 else int(out.value)


def permitted() -> bool | None:
    """This process holds AMX tile data permission (None: the kernel cannot say, e.g. not
    x86-64 Linux or a kernel before 5.16). Reads only: never requests."""
    mask = _mask(ARCH_GET_XCOMP_PERM)
    return None if mask is None else bool(mask >> XFEATURE_XTILEDATA & 1)


def supported() -> bool | None:
    """The kernel can grant tile data state on this machine (None: cannot say)."""
    mask = _mask(ARCH_GET_XCOMP_SUPP)
    return None if mask is None else bool(mask >> XFEATURE_XTILEDATA & 1)


def request() -> bool:
    """Asks for tile data permission; True when this process holds it afterwards."""
    _arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
    return permitted() is True


def install_from_env(environ: Mapping[str, str]) -> str:
    """The site hook: requests the permission where CPUID advertises AMX, unless
    ``$PDWB_AMX_GRANT=0``. Returns what it did (``granted``, ``refused``, ``off``, ``no-amx``),
    also left in ``$PDWB_AMX_HOOK`` for code later in this process."""
    if not advertised():
        state = "no-amx"
    elif environ.get(GRANT_ENV, "1") == "0":
        state = "off"
    else:
        state = "granted" if request() else "refused"
    os.environ[STATE_ENV] = state
    return state


def report() -> dict[str, object]:
    """This process's view, read without requesting: pid, CPUID, kernel support, permission,
    and what the site hook did."""
    return {"pid": os.getpid(), "advertised": advertised(), "supported": supported(),
            "permitted": permitted(), "hook": os.environ.get(STATE_ENV, "not-run")}
