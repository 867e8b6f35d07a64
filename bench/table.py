"""The suite's summary: one markdown row per benchmark, under a date-and-machine header."""

from __future__ import annotations

import math
import os
import platform
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path


@dataclass(frozen=True)
class TableRow:
    """One benchmark's line: what was measured, the headline ratio and what it is a ratio of."""

    benchmark: str
    measured: str
    ratio: float | None
    ratio_of: str
    ratio_text: str | None = None  # overrides the formatted ``ratio`` (e.g. "4/5")

    def cells(self) -> list[str]:
        shown = self.ratio_text if self.ratio_text is not None else fmt_ratio(self.ratio)
        return [self.benchmark, self.measured, shown, self.ratio_of]


COLUMNS = ("benchmark", "measured", "ratio", "ratio of")


def fmt_ratio(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if math.isinf(x):
        return "inf"
    return f"{x:.2f}x" if x >= 0.1 else f"{x:.3f}x"


def _escape(cell: str) -> str:
    return cell.replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: list[TableRow]) -> str:
    """A GitHub markdown table of ``rows`` (pipes in cells escaped)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    lines += ["| " + " | ".join(_escape(c) for c in row.cells()) + " |" for row in rows]
    return "\n".join(lines)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    """``AMD EPYC, 2 cores, x86_64, Linux 6.1, torch 2.13.0``-style description of this host."""
    import torch

    return (f"{cpu_model()}, {os.cpu_count()} cores, {platform.machine()}, "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}, "
            f"torch {torch.__version__}")


def header(now: datetime | None = None) -> str:
    now = now or datetime.now().astimezone()
    return f"measured {now.strftime('%Y-%m-%d %H:%M %Z')} on {machine()}"
