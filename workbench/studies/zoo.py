"""The bug zoo: every patch variant that is a bug on its own (``engine.patches.ZOO``), and
synthetic commit histories that plant one of them as an unconditional regression.

``plant_history(repo, bug, out)`` clones ``repo`` and adds ``commits - 1`` commits on top of its
HEAD: harmless edits (comment lines in real modules), and at ``culprit`` one edit of
``engine/config.py`` that turns ``bug`` on for every engine. The ground truth is returned and
written beside the clone (``truth.json``), never inside it, so an investigation of the clone
cannot read it.
"""

from __future__ import annotations

import json
import random
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.patches import PATCHES, ZOO
from workbench.investigate.commits import git

HARMLESS = ("engine/faults.py", "engine/registry.py", "engine/text/chat.py",
            "engine/http/limits.py", "workbench/report/plots.py", "workbench/observe/sampler.py")
CONFIG = "engine/config.py"
_ANCHOR = 'object.__setattr__(self, "patches", PatchSet.parse(self.patches).enabled)'


@dataclass(frozen=True)
class SyntheticHistory:
    """A clone whose commits ``good..bad`` (``commits`` of them, oldest first, ``good``
    included) contain one culprit at ``culprit_index``."""

    path: Path
    bug: str
    commits: tuple[str, ...]
    culprit_index: int

    @property
    def good(self) -> str:
        return self.commits[0]

    @property
    def bad(self) -> str:
        return self.commits[-1]

    @property
    def culprit(self) -> str:
        return self.commits[self.culprit_index]


def _commit(clone: Path, message: str) -> str:
    git(clone, "commit", "-q", "-a", "-m", message)
    return git(clone, "rev-parse", "HEAD")


def plant_history(repo: str | Path, bug: str, out: str | Path, commits: int = 16,
                  culprit: int | None = None, seed: int = 0) -> SyntheticHistory:
    """Clones ``repo`` into ``out`` and plants ``bug`` (a ``ZOO`` name) at commit ``culprit``
    (1..commits-1; default seeded) of a ``commits``-long history starting at the clone's HEAD."""
    PATCHES.get(bug)
    if bug not in ZOO:
        raise ValueError(f"{bug!r} is a modifier, not a bug; zoo bugs: {', '.join(ZOO)}")
    if commits < 2:
        raise ValueError("a history needs at least 2 commits (good and bad)")
    rng = random.Random(f"{seed}|{bug}")
    culprit = rng.randrange(1, commits) if culprit is None else culprit
    if not 1 <= culprit < commits:
        raise ValueError(f"culprit must lie in 1..{commits - 1}, got {culprit}")
    out = Path(out)
    subprocess.run(["git", "clone", "-q", str(Path(repo).resolve()), str(out)], check=True)
    git(out, "config", "user.email", "zoo@pdwb.invalid")
    git(out, "config", "user.name", "pdwb zoo")
    hashes = [git(out, "rev-parse", "HEAD")]
    for i in range(1, commits):
        if i == culprit:
            cfg = out / CONFIG
            text = cfg.read_text()
            if _ANCHOR not in text:
                raise RuntimeError(f"{CONFIG} lacks the line the zoo edits: {_ANCHOR}")
            cfg.write_text(text.replace(_ANCHOR, _ANCHOR[:-1] + f' | {{"{bug}"}})'))
            hashes.append(_commit(out, f"config: tidy patch parsing ({i})"))
        else:
            target = out / rng.choice(HARMLESS)
            target.write_text(target.read_text() + f"# maintenance note {i}\n")
            hashes.append(_commit(out, f"{target.name}: maintenance note {i}"))
    hist = SyntheticHistory(out, bug, tuple(hashes), culprit)
    truth = {**asdict(hist), "path": str(out), "culprit": hist.culprit}
    (out.parent / f"{out.name}.truth.json").write_text(json.dumps(truth, indent=1))
    return hist
