"""vLLM's real DeepSeek-V3.2 tool parser as a reference for ``parser_diff.compare``.

``tests/support/vllm_parser_ref.py`` runs in the vLLM side environment (it imports vLLM, so it
cannot run here) over every case and chunking at once; ``vllm_reference`` returns ``(one_shot,
streamed)`` callables that look the batch's outcomes up, in ``parser_diff``'s outcome form.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from support.dsml_fuzz import TOOLS, FuzzCase, chunkings
from support.parser_diff import Outcome, canonical
from workbench.deploy.vllm import vllm_python

REF_SCRIPT = Path(__file__).with_name("vllm_parser_ref.py")


def _outcome(raw: list) -> Outcome:
    content, calls = raw
    return content, tuple((name, canonical(args)) for name, args in calls)


def vllm_reference(cases: list[FuzzCase], seed: int = 0, timeout: float = 900,
                   tools: list[dict] | None = None) -> tuple[Callable, Callable]:
    """``(one_shot(text), streamed(chunks))`` of the real parser for ``cases`` under
    ``chunkings(text, seed)``; the request declares ``tools`` (default ``TOOLS``)."""
    payload = [{"text": c.text, "runs": chunkings(c.text, seed)} for c in cases]
    defs = tools if tools is not None else [t.to_openai() for t in TOOLS]
    with tempfile.TemporaryDirectory(prefix="pdwb-vllm-ref-") as tmp:
        src, dst, spec = (Path(tmp) / n for n in ("in.json", "out.json", "tools.json"))
        src.write_text(json.dumps(payload, ensure_ascii=False))
        spec.write_text(json.dumps(defs))
        proc = subprocess.run([str(vllm_python()), str(REF_SCRIPT), str(src), str(dst), str(spec)],
                              capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"vllm_parser_ref.py failed ({proc.returncode}):\n"
                               f"{proc.stderr[-4000:]}")
        out = json.loads(dst.read_text())
    one_shot = {p["text"]: _outcome(o["one_shot"]) for p, o in zip(payload, out, strict=True)}
    streamed = {tuple(p["runs"][label]): _outcome(o["runs"][label])
                for p, o in zip(payload, out, strict=True) for label in p["runs"]}
    return one_shot.__getitem__, lambda chunks: streamed[tuple(chunks)]
