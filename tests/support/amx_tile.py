"""A child process that executes one AMX tile instruction (LDTILECFG, TILEZERO tmm0,
TILERELEASE), optionally after the vLLM site hook's request for tile state: the mechanism behind
the vLLM worker's SIGILL, with nothing else in the process (no torch, no oneDNN).

Run: ``python tests/support/amx_tile.py grant|nogrant``; exit 0 when the tile instruction ran.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workbench" / "deploy" / "vllm_site"))
import pdwb_amx  # noqa: E402

# ldtilecfg (%rdi); tilezero %tmm0; tilerelease; ret   (objdump -b binary -m i386:x86-64)
CODE = bytes.fromhex("c4e2784907" "c4e27b49c0" "c4e27849c0" "c3")


def tile_config() -> ctypes.Array:
    """Palette 1, tmm0 16 rows of 64 bytes, every other tile unused (reserved bytes zero)."""
    cfg = (ctypes.c_uint8 * 64)()
    cfg[0] = 1
    cfg[16] = 64  # colsb[0], little-endian u16
    cfg[48] = 16  # rows[0]
    return cfg


def run_tile() -> None:
    buf = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    buf.write(CODE)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(addr)(ctypes.addressof(tile_config()))


if __name__ == "__main__":
    state = pdwb_amx.install_from_env({"PDWB_AMX_GRANT": "1" if sys.argv[1] == "grant" else "0"})
    print(state, pdwb_amx.permitted(), flush=True)
    run_tile()
    print("tile instruction ran", flush=True)
