"""Loaded by every interpreter of a vLLM server the workbench launches (its PYTHONPATH holds this
folder): asks Linux for AMX tile state where CPUID advertises AMX, before vLLM can run a tile
instruction (``pdwb_amx``; ``$PDWB_AMX_GRANT=0`` leaves it out, to study the SIGILL), paces
NIXL's UCX progress thread as ``$PDWB_NIXL_PROGRESS_DELAY_US`` says (see
``engine/transfer/progress.py``, loaded by path: the side environment has no ``engine``), and
dumps the Python stack of the thread SIGUSR2 lands in to the log (asked by
``workbench.deploy.watch`` when a server stops answering); fatal signals are dumped by
``PYTHONFAULTHANDLER``, set by the launcher."""

import faulthandler
import importlib.util
import os
import signal
from pathlib import Path

import pdwb_amx

pdwb_amx.install_from_env(os.environ)

_PROGRESS = Path(__file__).resolve().parents[3] / "engine" / "transfer" / "progress.py"
_spec = importlib.util.spec_from_file_location("_pdwb_nixl_progress", _PROGRESS)
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
_mod.install_from_env(os.environ)
faulthandler.register(signal.SIGUSR2, all_threads=False)
