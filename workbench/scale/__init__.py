"""Where work runs: ``Executor`` maps a search's tasks over this process or a Ray cluster
(local by default, any by address) and hosts actors; ``Progress`` reports on it. The bottom
layer of the workbench: it imports nothing else of it."""

from workbench.scale.executor import Executor, Placement, Remote, WorkerLost
from workbench.scale.progress import Progress, in_notebook
from workbench.scale.shared import executor_for

__all__ = ["Executor", "Placement", "Progress", "Remote", "WorkerLost", "executor_for",
           "in_notebook"]
