"""Named workloads: the load shapes of an investigation, shipped as JSON under ``data/workloads``.

A workload file holds a ``description`` and the ``LoadConfig`` fields it sets (sessions, turns,
kill fraction and window, token budget, seed, duration); the rest keep their defaults.
``run_workload(target, "race_burst", seed=3)`` runs one through ``inject_concurrency`` with
overrides, so a notebook, the CLI (``wb load --workload NAME``) and a bug report name the same
load by one word and replay it by seed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from engine.config import data_dir
from engine.registry import UnknownVariantError
from workbench.drive.load import LoadConfig

WORKLOADS_DIR = data_dir() / "workloads"
RUN_FIELDS = ("sessions", "turns", "kill_fraction", "duration_s", "seed", "max_tokens",
              "kill_window_s")
"""The ``LoadConfig`` fields a workload may set (those ``inject_concurrency`` takes)."""


@dataclass(frozen=True)
class Workload:
    """One named load shape. Invariant: ``load`` is a validated ``LoadConfig``."""

    name: str
    description: str
    load: LoadConfig

    def kwargs(self) -> dict:
        """The ``inject_concurrency`` keyword arguments this workload sets."""
        return {k: getattr(self.load, k) for k in RUN_FIELDS}

    @classmethod
    def from_file(cls, path: str | Path) -> Workload:
        path = Path(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: a workload is a JSON object")
        description = raw.pop("description", "")
        unknown = sorted(set(raw) - set(RUN_FIELDS))
        if unknown:
            raise ValueError(f"{path}: unknown workload keys {unknown}; valid: description, "
                             f"{', '.join(RUN_FIELDS)}")
        return cls(path.stem, description, LoadConfig(**raw))


def workload_names(directory: Path = WORKLOADS_DIR) -> list[str]:
    """Names of the workload files in ``directory`` (file stems), sorted."""
    return sorted(p.stem for p in directory.glob("*.json"))


def load_workload(name: str | Path, directory: Path = WORKLOADS_DIR) -> Workload:
    """The shipped workload ``name`` (or a path to a workload file); unknown names list the
    shipped ones."""
    path = Path(name)
    if path.suffix == ".json" or path.exists():
        return Workload.from_file(path)
    candidate = directory / f"{name}.json"
    if not candidate.exists():
        raise UnknownVariantError(f"unknown workload {str(name)!r}; shipped: "
                                  f"{', '.join(workload_names(directory))}")
    return Workload.from_file(candidate)


def list_workloads(directory: Path = WORKLOADS_DIR) -> pl.DataFrame:
    """One row per shipped workload: name, description and the load fields it runs with."""
    rows = []
    for name in workload_names(directory):
        w = load_workload(name, directory)
        rows.append({"name": w.name, **w.kwargs(), "description": w.description})
    return pl.DataFrame(rows)


def run_workload(target, workload: str | Path | Workload, **overrides):
    """``inject_concurrency(target, **workload.kwargs(), **overrides)``; ``overrides`` may also
    set ``inject_concurrency``'s other options (``oracle``, ``capture_dir``, ``progress``)."""
    from workbench.drive.concurrency import inject_concurrency

    w = workload if isinstance(workload, Workload) else load_workload(workload)
    return inject_concurrency(target, **{**w.kwargs(), **overrides})
