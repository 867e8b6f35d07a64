"""Frozen, validated configuration dataclasses for the model and the engine."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from engine.faults import FaultConfig

DATA_ENV = "PDWB_DATA"


def data_dir() -> Path:
    """The data folder (models, tool pool, workloads): ``$PDWB_DATA``, else the checkout's
    beside this package, else ``./data`` (an installed package run from a checkout)."""
    if os.environ.get(DATA_ENV):
        return Path(os.environ[DATA_ENV])
    beside = Path(__file__).resolve().parents[1] / "data"
    return beside if beside.is_dir() else Path("data").resolve()

INDEX_K_DTYPES = ("fp8", "bf16", "fp32")
KV_DTYPES = ("fp32", "bf16")


class ConfigError(ValueError):
    """Raised for invalid or unknown configuration options."""


def _from_dict(cls, data: dict):
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} options {unknown}; valid: {sorted(names)}")
    return cls(**data)


@dataclass(frozen=True)
class ModelConfig:
    """Tiny DeepSeek-style decoder with a lightning indexer per layer."""

    vocab_size: int = 128
    n_layers: int = 4
    d_model: int = 128
    n_heads: int = 4
    d_ff: int = 320
    max_seq_len: int = 1024
    rope_theta: float = 10000.0
    index_heads: int = 2
    index_dim: int = 32
    index_topk: int = 64
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model {self.d_model} not divisible by n_heads {self.n_heads}")
        if self.head_dim % 2 or self.index_dim % 2:
            raise ConfigError("head_dim and index_dim must be even (RoPE)")
        for name in ("vocab_size", "n_layers", "d_ff", "max_seq_len", "index_heads", "index_topk"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        return _from_dict(cls, data)

    @classmethod
    def load(cls, path: str | Path) -> ModelConfig:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def to_dict(self) -> dict:
        return asdict(self)


def _check_choice(name: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ConfigError(f"unknown {name} {value!r}; valid: {', '.join(valid)}")


@dataclass(frozen=True)
class EngineConfig:
    """Serving engine options. ``device`` and dtypes are never implied: everything reads them here.

    Invariant: ``num_pages * page_size`` bounds the tokens resident at once; a request is admitted
    only when pages for its prompt plus ``max_tokens`` can be reserved.
    """

    model_dir: str = "data/model"
    device: str = "cpu"
    page_size: int = 16
    num_pages: int = 2048
    kv_dtype: str = "fp32"
    index_k_dtype: str = "fp8"
    kernels: str = "torch"
    max_batch_tokens: int = 512
    chunk_size: int = 256
    max_running: int = 64
    max_prompt_tokens: int = 900
    max_new_tokens: int = 512
    prefix_cache: bool = True
    batch_invariant: bool = True
    threads: int = 1  # torch threads per engine; 1 avoids oversubscription on small CPUs
    patches: frozenset[str] = frozenset()
    hicache: bool = False
    hicache_host_pages: int = 4096
    hicache_offload_on_finish: bool = False
    faults: FaultConfig = field(default_factory=FaultConfig)
    debug_capture: int = 0
    tool_parser: str = "strict"  # engine.text.parsers.PARSERS
    max_body_bytes: int = 8 * 1024 * 1024  # larger request bodies get 413

    def __post_init__(self) -> None:
        from engine.patch_set import PATCHES, PatchSet
        from engine.text.parsers import PARSERS

        PARSERS.get(self.tool_parser)

        object.__setattr__(self, "patches", PatchSet.parse(self.patches).enabled)
        if isinstance(self.faults, dict):
            object.__setattr__(self, "faults", _from_dict(FaultConfig, self.faults))
        for name in sorted(self.patches):
            for key, value in PATCHES.get(name).config:
                object.__setattr__(self, key, value)
        _check_choice("kv_dtype", self.kv_dtype, KV_DTYPES)
        _check_choice("index_k_dtype", self.index_k_dtype, INDEX_K_DTYPES)
        for name in ("page_size", "num_pages", "max_batch_tokens", "chunk_size", "max_running",
                     "max_prompt_tokens", "max_new_tokens", "max_body_bytes"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.chunk_size > self.max_batch_tokens:
            raise ConfigError("chunk_size must not exceed max_batch_tokens")

    @classmethod
    def from_dict(cls, data: dict) -> EngineConfig:
        return _from_dict(cls, data)

    def replace(self, **changes) -> EngineConfig:
        current = {f.name: getattr(self, f.name) for f in fields(self)}
        return _from_dict(type(self), {**current, **changes})

    def to_dict(self) -> dict:
        out = asdict(self)
        out["patches"] = sorted(self.patches)
        return out
