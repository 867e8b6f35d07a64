"""The vLLM backend: a real vLLM prefill + decode pair over NIXL behind the real vllm-router.

Everything runs from the side environment ``scripts/vllm_env.sh`` builds (pins in
``scripts/vllm-pins.txt``; folder ``$PDWB_VLLM`` or ``~/.cache/pdwb/vllm-<pins hash>``). Both
servers load ``data/llama`` (a Llama exported by ``engine.training.hf``) with vLLM's own
DeepSeek-V3.2 tool parser, ``--enforce-eager`` and the ``NixlConnector`` (``kv_both``, CPU
buffers). Every address is loopback; every cache and log lives in the pair's log folder.
NIXL's UCX progress thread is paced (``VllmOptions.nixl_progress_delay_us``; see
``engine/transfer/progress.py``): stock NIXL busy-polls one core per server. Every vLLM
interpreter asks Linux for AMX tile state where CPUID advertises AMX (``VllmOptions.amx_grant``;
``vllm_site/pdwb_amx.py``): without it vLLM's AMX attention kernel dies by SIGILL. Every worker
carries the workbench's extension (``vllm_site/pdwb_worker.py``), reached through
``POST /collective_rpc`` (``worker_rpc``).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx

from engine.config import data_dir
from engine.transfer.progress import DEFAULT_DELAY_US, DELAY_ENV
from workbench.deploy.process import LaunchError, ServerProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
PINS = ROOT / "scripts" / "vllm-pins.txt"
MODEL_DIR = data_dir() / "llama"
SERVED_MODEL = "tiny-llama"
SITE_DIR = Path(__file__).resolve().parent / "vllm_site"  # its sitecustomize runs in every vLLM
WORKER_EXTENSION = "pdwb_worker.WorkbenchExtension"
AMX_GRANT_ENV = "PDWB_AMX_GRANT"  # vllm_site/pdwb_amx.py reads it (no workbench import there)
TOOL_PARSER = "deepseek_v32"
KV_TRANSFER = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}


class VllmNotInstalled(LaunchError):
    """The pinned vLLM environment has not been built (``make vllm-env``)."""


def env_dir() -> Path:
    """The side environment's folder for the current pins (built or not)."""
    if os.environ.get("PDWB_VLLM"):
        return Path(os.environ["PDWB_VLLM"])
    key = hashlib.sha256(PINS.read_bytes()).hexdigest()[:12]
    return Path.home() / ".cache" / "pdwb" / f"vllm-{key}"


def vllm_python() -> Path:
    """The side environment's interpreter; raises ``VllmNotInstalled`` when it is not built for
    the current pins."""
    d = env_dir()
    stamp = d / ".installed"
    if not stamp.exists() or stamp.read_bytes() != PINS.read_bytes():
        raise VllmNotInstalled(f"no vLLM environment for {PINS.name} at {d}: run `make vllm-env`"
                               " (scripts/vllm_env.sh)")
    return d / "bin" / "python"


@dataclass(frozen=True)
class VllmOptions:
    """Per-launch vLLM settings. ``extra_args`` go to both servers' command lines.
    ``nixl_progress_delay_us`` bounds the sleep of NIXL's UCX progress thread (0: NIXL's own
    busy poll, which takes a core per server even when idle). ``amx_grant``: every vLLM
    process asks for AMX tile state before vLLM runs (off only to study the SIGILL it prevents)."""

    model_dir: Path = MODEL_DIR
    max_model_len: int = 1024
    kv_cache_gib: int = 1
    max_num_seqs: int = 64
    extra_args: tuple[str, ...] = ()
    nixl_progress_delay_us: int = DEFAULT_DELAY_US
    amx_grant: bool = True

    def __post_init__(self) -> None:
        if not (Path(self.model_dir) / "config.json").exists():
            raise ValueError(f"{self.model_dir} is not a Hugging Face model folder "
                             "(no config.json)")
        if self.max_model_len < 16 or self.kv_cache_gib < 1 or self.max_num_seqs < 1:
            raise ValueError("need max_model_len >= 16, kv_cache_gib >= 1, max_num_seqs >= 1")
        if self.nixl_progress_delay_us < 0:
            raise ValueError("nixl_progress_delay_us must be >= 0")


def server_env(log_dir: Path) -> dict[str, str]:
    """Environment of one vLLM server: loopback only, offline, caches in ``log_dir``."""
    return {"VLLM_HOST_IP": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port()), "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "VLLM_CACHE_ROOT": str(log_dir / "vllm-cache"),
            # ZMQ ipc paths must fit sockaddr_un (107 bytes): a short folder, not the log's
            "VLLM_RPC_BASE_PATH": tempfile.mkdtemp(prefix="pdwb-rpc-"), "VLLM_NO_USAGE_STATS": "1",
            "VLLM_LOGGING_LEVEL": "INFO", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": "1"}


def server(name: str, log_dir: Path, opts: VllmOptions, seed: int) -> ServerProcess:
    """An unstarted vLLM OpenAI server (prefill or decode: with NIXL both are ``kv_both``)."""
    py = str(vllm_python())
    srv = ServerProcess(name, [], log_dir, format_argv=False, env=server_env(log_dir),
                        stack_signal=True)  # the site hook registers SIGUSR2
    srv.argv = [py, "-m", "vllm.entrypoints.openai.api_server", "--model", str(opts.model_dir),
                "--served-model-name", SERVED_MODEL, "--host", srv.host, "--port", str(srv.port),
                "--enforce-eager", "--max-model-len", str(opts.max_model_len),
                "--max-num-seqs", str(opts.max_num_seqs), "--seed", str(seed),
                "--enable-auto-tool-choice", "--tool-call-parser", TOOL_PARSER,
                "--kv-transfer-config", json.dumps(KV_TRANSFER),
                "--worker-extension-cls", WORKER_EXTENSION, *opts.extra_args]
    srv.env.update(site_env(opts))
    srv.env["VLLM_CPU_KVCACHE_SPACE"] = str(opts.kv_cache_gib)
    return srv


def site_env(opts: VllmOptions) -> dict[str, str]:
    """What the site hook of a vLLM interpreter reads (the ISA probe runs under it too)."""
    return {"PYTHONPATH": str(SITE_DIR), DELAY_ENV: str(opts.nixl_progress_delay_us),
            AMX_GRANT_ENV: "1" if opts.amx_grant else "0", "VLLM_SERVER_DEV_MODE": "1"}


def worker_rpc(url: str, method: str, timeout_s: float = 30.0) -> list:
    """Each worker's answer to ``method`` of ``pdwb_worker.WorkbenchExtension`` (``POST
    /collective_rpc`` on a vLLM server at ``url``). Raises ``httpx.HTTPError`` when the
    server does not answer."""
    r = httpx.post(f"{url}/collective_rpc", json={"method": method, "timeout": timeout_s},
                   timeout=timeout_s + 5)
    r.raise_for_status()
    return r.json()["results"]


def router(log_dir: Path, prefill: list[ServerProcess], decode: list[ServerProcess]) \
        -> ServerProcess:
    """An unstarted vllm-router in vLLM PD mode over NIXL, round robin on both sides."""
    front = ServerProcess("router", [], log_dir, format_argv=False, health="/health")
    argv = [str(vllm_python()), "-m", "vllm_router.launch_router", "--vllm-pd-disaggregation",
            "--kv-connector", "nixl", "--host", front.host, "--port", str(front.port),
            "--policy", "round_robin", "--log-level", "warning", "--request-timeout-secs", "300",
            "--log-dir", str(log_dir / "router-logs")]
    for p in prefill:
        argv += ["--prefill", p.url]
    for d in decode:
        argv += ["--decode", d.url]
    front.argv = argv
    return front
