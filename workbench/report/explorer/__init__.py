"""The flagged-request explorer: its table and filters (``table``), HTML for the static export
(``html``), the live widget (``widget``) and the view a notebook cell shows (``view``)."""

from workbench.report.explorer.table import ExplorerFilter
from workbench.report.explorer.view import Explorer, explore

__all__ = ["Explorer", "ExplorerFilter", "explore"]
