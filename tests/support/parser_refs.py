"""The real tool-call parsers our variants are checked against, imported from pinned wheels.

``make refs`` downloads the wheels (``--no-deps``) into ``$PDWB_REFS`` (default
``~/.cache/pdwb/refs``), outside the clone and keyed by version. Only the detector's modules
are extracted and imported; SGLang's OpenAI protocol models and its env table, which pull in the
server, are replaced by stand-ins with the fields the detector reads.
"""

from __future__ import annotations

import os
import sys
import types
import zipfile
from pathlib import Path

from pydantic import BaseModel

SGLANG_VERSION = "0.5.23"  # fail-closed: the `sglang` variant
SGLANG_LEAKY_VERSION = "0.5.15"  # last to return the whole text when no call parses
REFS = Path(os.environ.get("PDWB_REFS", Path.home() / ".cache" / "pdwb" / "refs"))
_MEMBERS = ("deepseekv32_detector", "base_format_detector", "core_types", "utils")


class RefMissing(RuntimeError):
    """A reference wheel is not downloaded; ``make refs`` fetches it."""


def _extract(version: str) -> Path:
    root = REFS / f"sglang-{version}"
    pkg = root / "sglang" / "srt" / "function_call"
    if all((pkg / f"{m}.py").exists() for m in _MEMBERS):
        return root
    wheels = sorted((REFS / "wheels").glob(f"sglang-{version}-*.whl"))
    if not wheels:
        raise RefMissing(f"no sglang {version} wheel under {REFS / 'wheels'}: run `make refs`")
    with zipfile.ZipFile(wheels[0]) as zf:
        for m in _MEMBERS:
            zf.extract(f"sglang/srt/function_call/{m}.py", root)
    return root


def _module(name: str, path: Path | None = None, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    if path is not None:
        mod.__path__ = [str(path)]
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


class _Function(BaseModel):
    name: str
    description: str | None = None
    parameters: dict | None = None
    strict: bool = False


class _Tool(BaseModel):
    type: str = "function"
    function: _Function


class _ToolChoice(BaseModel):
    type: str = "function"
    function: dict | None = None


class _Env:
    def __init__(self, default: bool) -> None:
        self.default = default

    def get(self) -> bool:
        return self.default


_LOADED: dict[str, tuple] = {}


def _import_detector(root: Path):
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        del sys.modules[name]
    _module("sglang", root / "sglang")
    _module("sglang.srt", root / "sglang" / "srt")
    _module("sglang.srt.function_call", root / "sglang" / "srt" / "function_call")
    _module("sglang.srt.entrypoints")
    _module("sglang.srt.entrypoints.openai")
    _module("sglang.srt.entrypoints.openai.protocol", Tool=_Tool, ToolChoice=_ToolChoice,
            Function=_Function)
    envs = types.SimpleNamespace(SGLANG_FORWARD_UNKNOWN_TOOLS=_Env(False))
    _module("sglang.srt.environ", envs=envs)
    from sglang.srt.function_call.deepseekv32_detector import DeepSeekV32Detector
    return DeepSeekV32Detector


def sglang_detector(version: str = SGLANG_VERSION):
    """``(DeepSeekV32Detector, make_tool)``: the real detector class of SGLang ``version`` and a
    Tool constructor. Several versions load side by side: each class keeps its own modules."""
    if version not in _LOADED:
        _LOADED[version] = (_import_detector(_extract(version)), _make_tool)
    return _LOADED[version]


def _make_tool(name: str) -> _Tool:
    return _Tool(function=_Function(name=name, parameters={}))
