"""Claims the pipeline's results support, as ``FindingDraft``s a notebook records (it computes
no check itself): where a localized corruption first appears and what the transfer did with it
(``localization_findings``), and which patch of a series a bisection blames
(``culprit_findings``)."""

from __future__ import annotations

from collections.abc import Sequence

from workbench.investigate.series import PatchSeries
from workbench.judge import FindingDraft
from workbench.observe import Localization, Stage
from workbench.search import BisectResult


def localization_findings(locs: Sequence[Localization]) -> list[FindingDraft]:
    """The first divergence of the first room, consistent across every localized room; then
    whether the decode holds exactly the prefill's prompt buffers."""
    firsts = [(x.first.stage.name.lower(), x.first.buffer) for x in locs if x.first is not None]
    head = locs[0].describe() if locs else "no room localized"
    first = FindingDraft(
        f"first divergence: {head}",
        {"a flagged room localized": bool(locs) and locs[0].first is not None,
         "every localized room diverges first at the same stage and buffer":
             len(firsts) > 0 and len(set(firsts)) == 1},
        {"first": [x.first.describe() for x in locs if x.first is not None],
         "divergences": [len(x.divergences) for x in locs]})
    moved = [d for lo in locs for d in lo.divergences if d.stage is Stage.TRANSFER]
    title = ("the decode holds exactly the prefill's prompt buffers" if not moved else
             f"the transfer changed buffers: {sorted({d.buffer for d in moved})}")
    copy = FindingDraft(title, {"every localized room compared both sides":
                                bool(locs) and all(x.compared > 0 for x in locs)},
                        {"transfer_divergences": [d.describe() for d in moved][:6],
                         "rooms": len(locs)})
    return [first, copy]


def culprit_findings(res: BisectResult, series: Sequence[str], confidence: float,
                     expected: str) -> list[FindingDraft]:
    """A patch-series bisection blames the candidate that adds ``expected``, at ``confidence``."""
    added = PatchSeries(tuple(series)).added_by(res.claimed) if res.claimed else None
    return [FindingDraft(
        f"the culprit is the patch that adds {expected}",
        {"bisection converged": res.converged,
         f"posterior >= {confidence}": res.confidence >= confidence,
         f"culprit adds {expected}": added == expected},
        {"culprit": res.claimed, "added": added, "posterior": res.confidence,
         "trials": res.trials_spent, "fail_rate_bad": res.estimated_fail_rate_bad})]
