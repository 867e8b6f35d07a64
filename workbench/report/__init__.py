"""Rendering: matplotlib figures for notebook cells (``plots``), executing a notebook to HTML
(``run_report``) and the end-to-end demo. The top workbench package: it imports every other
one and nothing imports it but the CLI."""

from workbench.report import plots
from workbench.report.render import ReportUnavailable, require_report_extra, run_report

__all__ = ["ReportUnavailable", "plots", "require_report_extra", "run_report"]
