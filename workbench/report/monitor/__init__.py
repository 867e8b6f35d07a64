"""The pair monitor: samples per role (``data``), its HTML panel (``html``) and the view a
notebook cell shows, live or static (``view``)."""

from workbench.report.monitor.view import Monitor, monitor

__all__ = ["Monitor", "monitor"]
