"""Rendering: matplotlib figures for notebook cells (``plots``), the views (``explore``,
``monitor``; each with a static rendering), executing a notebook to HTML (``run_report``, with the
embedded DSML font). The top workbench package: it imports every other
one and nothing imports it but the CLI."""

from workbench.report import plots
from workbench.report.divergence import divergence_map
from workbench.report.explorer import Explorer, ExplorerFilter, explore
from workbench.report.fonts import embed_fonts, font_face_css
from workbench.report.live import divergence_view, live_bisection, schedule_view
from workbench.report.monitor import Monitor, monitor
from workbench.report.render import ReportUnavailable, require_report_extra, run_report
from workbench.report.static import View, export_html
from workbench.report.timeline import plot_schedule_timeline, schedule_timeline

__all__ = ["Explorer", "ExplorerFilter", "Monitor", "ReportUnavailable", "View",
           "divergence_map", "divergence_view", "embed_fonts", "explore", "export_html",
           "font_face_css", "live_bisection", "monitor", "plot_schedule_timeline", "plots",
           "require_report_extra", "run_report", "schedule_timeline",
           "schedule_view"]
