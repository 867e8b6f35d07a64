"""The frozen spec of an investigation: every parameter named, typed, defaulted and explained
once. ``investigate(spec)`` runs it, the ``Investigation`` keeps it, the findings ledger stores
it (``replay()``), ``InvestigationSpec.from_replay`` reads it back, and ``wb investigate``'s
flags are generated from its fields (``workbench.cli.flags``). A field's ``metadata["help"]`` is
its flag's help text.

``BisectSpec`` is the same for a commit bisection (``bisect_commits(spec)``, ``wb bisect
--commits``); the result keeps it (``BisectResult.spec``).

Invariant: ``InvestigationSpec.from_replay(spec.to_json()) == spec`` for every spec.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from workbench.drive import Shape
from workbench.judge import JUDGED_ROOMS
from workbench.search import CONFIDENCE

ENDS_BUDGET = 8  # bursts the bad end gets to fail once before anything is bisected


def _f(default: Any, help: str) -> Any:  # noqa: A002 - the flag's help text
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class InvestigationSpec:
    """One investigation of the code in ``source`` (None: this checkout), with ``patches``
    enabled. ``shapes``/``modes``: None means the default order (``SWEEP_ORDER``,
    ``MODE_ORDER``), ``()`` none. ``commits``: ``"GOOD..BAD"`` bisected after a hit.
    ``judge``: None compares every completed room. ``runs_dir``: captures, logs, trial store."""

    source: str | None = _f(None, "checkout to investigate (default: this one)")
    patches: tuple[str, ...] = _f((), "patch variants to enable, comma separated")
    seed: int = _f(0, "seed of every burst, kill and room (a run replays from it)")
    shapes: tuple[str, ...] | None = _f(None, "shapes to sweep, comma separated (default: all, "
                                              "in order)")
    modes: tuple[str, ...] | None = _f(None, "engine modes swept after the shapes, comma "
                                             "separated (default: all; '' for none)")
    pairs: bool = _f(True, "then pairs of modes from different axes")
    cap_s: float | None = _f(None, "bound on the sweep in seconds (no cell starts after it)")
    bursts_per_shape: int = _f(1, "bursts per sweep cell")
    judge: int | None = _f(JUDGED_ROOMS, "rooms per burst the buffer oracle compares with the "
                                         "reference (a count, or all)")
    commits: str | None = _f(None, "GOOD..BAD: bisect this range of source's repository after "
                                   "a hit")
    max_trials: int = _f(40, "the bisection's trial budget")
    confidence: float = _f(CONFIDENCE, "posterior a culprit must reach")
    runs_dir: str = _f("runs/investigate", "captures, logs and the trial store")

    def __post_init__(self) -> None:
        for name in ("patches", "shapes", "modes"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
        if self.commits is not None:
            self.good_bad  # noqa: B018 - validates the range
        if not 0.5 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0.5, 1), not {self.confidence}")
        if self.judge is not None and self.judge < 0:
            raise ValueError(f"judge must be >= 0 or None (every room), not {self.judge}")

    @property
    def good_bad(self) -> tuple[str, str] | None:
        """``commits`` as (good, bad); raises ValueError for a malformed range."""
        return None if self.commits is None else _range(self.commits)

    def to_json(self) -> dict[str, Any]:
        """The spec as JSON values (tuples as lists), as the ledger keeps it."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_replay(cls, data: dict[str, Any]) -> InvestigationSpec:
        """The spec a ledger row's ``replay`` (or ``to_json``) holds; other keys are ignored."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.get("spec", data).items() if k in names})


def _range(commits: str) -> tuple[str, str]:
    good, _, bad = commits.partition("..")
    if not good or not bad:
        raise ValueError(f"commits wants GOOD..BAD, not {commits!r}")
    return good, bad


@dataclass(frozen=True)
class BisectSpec:
    """One Bayesian bisection of the commits ``commits`` (``"GOOD..BAD"``, ``GOOD`` included as
    candidate 0) of the checkout ``source``. ``shape``: a shape name or a ``Shape``; ``judge``:
    None compares every completed room; ``deployments``: k pairs at once, each round's probes
    chosen together (on ``workers``/``address``, ``workbench.scale``); ``store``: the trial
    store that makes it resumable (None: not kept); ``worktrees`` (None:
    ``<source>/.git/pdwb-worktrees``) caches one tree per commit."""

    commits: str = _f("", "GOOD..BAD: the commits of --source to bisect")
    source: str = _f(".", "the checkout whose commits are bisected")
    shape: str | Shape = _f("baseline", "the load shape of each trial")
    patches: tuple[str, ...] = _f((), "patch variants enabled on every candidate commit, "
                                      "comma separated")
    judge: int | None = _f(JUDGED_ROOMS, "rooms per burst the buffer oracle compares with the "
                                         "reference (a count, or all)")
    confidence: float = _f(CONFIDENCE, "posterior a culprit must reach")
    max_trials: int = _f(40, "trial budget")
    ends_budget: int = _f(ENDS_BUDGET, "trials the bad end gets to fail once before bisecting "
                                       "(0: no check)")
    seed: int = _f(0, "seed of every trial's burst")
    deployments: int = _f(1, "deployments at once, each round's probes chosen together")
    workers: int | None = _f(None, "1: in this process; default: in process first, a local Ray "
                                   "cluster of this machine's cores after a while")
    address: str | None = _f(None, "a Ray cluster's address (or $RAY_ADDRESS)")
    store: str | None = _f("runs/bisect.sqlite", "trial store (SQLite), resumable; None: "
                                                 "not kept")
    worktrees: str | None = _f(None, "where each commit's worktree is kept")
    log_dir: str | None = _f(None, "server logs, one folder per commit")
    experiment: str | None = _f(None, "the store's experiment name (default: from the range)")

    def __post_init__(self) -> None:
        if not isinstance(self.patches, tuple):
            object.__setattr__(self, "patches", tuple(self.patches))
        for name in ("source", "store", "worktrees", "log_dir"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                object.__setattr__(self, name, str(value))
        _range(self.commits)
        if not 0.5 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0.5, 1), not {self.confidence}")
        if self.deployments < 1 or self.max_trials < 1 or self.ends_budget < 0:
            raise ValueError("need deployments >= 1, max_trials >= 1 and ends_budget >= 0")

    @property
    def good_bad(self) -> tuple[str, str]:
        return _range(self.commits)
