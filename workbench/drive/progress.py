"""Live progress: an ipywidgets bar inside Jupyter, a throttled log line in a terminal."""

from __future__ import annotations

import logging
import sys
import time

log = logging.getLogger(__name__)


def in_notebook() -> bool:
    shell = sys.modules.get("IPython")
    ip = shell.get_ipython() if shell and hasattr(shell, "get_ipython") else None
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


class Progress:
    """``update(done, flagged)``; ``close()``. Widgets when in a notebook, logging otherwise."""

    def __init__(self, total: int, label: str, enabled: bool = True) -> None:
        self.total, self.label, self.enabled = total, label, enabled
        self._last = 0.0
        self.bar = self.text = None
        if enabled and in_notebook():
            import ipywidgets as w
            from IPython.display import display

            self.bar = w.IntProgress(min=0, max=max(1, total), description=label)
            self.text = w.HTML()
            display(w.HBox([self.bar, self.text]))

    def update(self, done: int, flagged: int, extra: str = "") -> None:
        if not self.enabled:
            return
        msg = f"{done}/{self.total} requests, {flagged} flagged {extra}"
        if self.bar is not None:
            self.bar.value = min(done, self.total)
            self.text.value = msg
        elif time.monotonic() - self._last > 2.0 or done >= self.total:
            self._last = time.monotonic()
            log.info("%s: %s", self.label, msg)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.bar_style = "success"
