"""Live progress: an ipywidgets bar inside Jupyter, a throttled log line in a terminal."""

from __future__ import annotations

import html
import logging
import sys
import time

log = logging.getLogger(__name__)


def in_notebook() -> bool:
    shell = sys.modules.get("IPython")
    ip = shell.get_ipython() if shell and hasattr(shell, "get_ipython") else None
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


class Progress:
    """``update(done, flagged)``; ``close()``. Widgets when in a notebook, logging otherwise.

    ``unit`` names what is counted ("requests", "schedules"), ``flag`` what a bad one is
    ("flagged", "failing"); the line carries the rate since construction and ``link`` (e.g. the
    Ray dashboard) when given. Never raises into the work it reports on."""

    def __init__(self, total: int, label: str, enabled: bool = True, unit: str = "requests",
                 flag: str = "flagged", link: str | None = None) -> None:
        self.total, self.label, self.enabled = total, label, enabled
        self.unit, self.flag, self.link = unit, flag, link
        self._t0 = self._last = time.monotonic()
        self.bar = self.text = None
        if enabled and in_notebook():
            import ipywidgets as w
            from IPython.display import display

            self.bar = w.IntProgress(min=0, max=max(1, total), description=label)
            self.text = w.HTML()
            display(w.HBox([self.bar, self.text]))
        if enabled and link:
            log.info("%s: dashboard %s", label, link)

    def message(self, done: int, flagged: int, extra: str = "") -> str:
        rate = done / max(1e-9, time.monotonic() - self._t0)
        return (f"{done}/{self.total} {self.unit}, {flagged} {self.flag}, {rate:.2f}/s"
                f"{' ' + extra if extra else ''}")

    def update(self, done: int, flagged: int, extra: str = "") -> None:
        if not self.enabled:
            return
        msg = self.message(done, flagged, extra)
        if self.bar is not None:
            self.bar.value = min(done, self.total)
            link = (f' <a href="{html.escape(self.link)}" target="_blank">dashboard</a>'
                    if self.link else "")
            self.text.value = html.escape(msg) + link
        elif time.monotonic() - self._last > 2.0 or done >= self.total:
            self._last = time.monotonic()
            log.info("%s: %s", self.label, msg)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.bar_style = "success"
