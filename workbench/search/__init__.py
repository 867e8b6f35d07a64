"""Pure statistics of intermittent failures: rate priors and posteriors, the trial store, noisy
bisection and delta debugging. Nothing here starts a server; a trial is any callable that
returns ``Counts``. The lowest workbench package (imports only the standard library and numpy)."""

from workbench.search.bisect import bisect, fixed_repeat_bisect
from workbench.search.ddmin import ddmin
from workbench.search.posterior import Posterior
from workbench.search.rate_prior import GridRate, RatePrior
from workbench.search.result import CONFIDENCE, BisectOutcome, BisectResult
from workbench.search.trials import Counts, Trial, TrialStore, derive_seed, run_parallel

__all__ = ["CONFIDENCE", "BisectOutcome", "BisectResult", "Counts", "GridRate", "Posterior",
           "RatePrior", "Trial", "TrialStore", "bisect", "ddmin", "derive_seed",
           "fixed_repeat_bisect", "run_parallel"]
