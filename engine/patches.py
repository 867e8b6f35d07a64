"""Named patch variants that reproduce real PD bug classes. Every one is off by default.

A launch selects any combination by name (``--set patches=a,b``); ``PatchSet`` validates names
against the registry and is reported by ``/debug/patches``.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.registry import Registry


@dataclass(frozen=True)
class Patch:
    name: str
    description: str
    bug_class: str


PATCHES: Registry[Patch] = Registry("patch variant")
for _p in (
    Patch("hicache_index_k_no_wait",
          "HiCache layer-wise load-back: index-K of layer i is not covered by the per-layer "
          "done counter that gates the main KV read (it lands after the counter advanced) and "
          "the indexer reads it without waiting; the PD KV sender, trusting the counter, ships "
          "index-K pages still loading.",
          "missing synchronization (read-before-load race) -> stale index-K at the prefill and, "
          "shipped, at every decode step: wrong top-k, corrupted output / DSML leaking into "
          "content"),
    Patch("bf16_index_k",
          "Store index-K in bf16 instead of fp8 e4m3: twice the bytes per token, so every copy "
          "of index-K (load-back, transfer) takes longer.",
          "race-window widening (a benign-looking change that makes a latent race fire)"),
    Patch("abort_orphan_transfer_entry",
          "Decode abort cleanup marks the room Failed but leaves its entry (and its pages) in "
          "the transfer queue.",
          "resource leak -> transfer queue fills with orphans and wedges"),
    Patch("late_write_after_abort",
          "Decode frees an aborted room's pages at once, while the prefill may still be "
          "writing into them; the pages are reused by another request.",
          "use-after-free via a late one-sided NIXL WRITE -> corruption of an unrelated request"),
    Patch("overlap_schedule",
          "Overlap scheduling: the next batch is scheduled while the previous step's results "
          "are still being processed, so finished/aborted requests are released one step late.",
          "ordering change that shifts race windows (SGLang's default overlap mode)"),
):
    PATCHES.register(_p.name, _p)


@dataclass(frozen=True)
class PatchSet:
    """A validated set of enabled patch names; ``"name" in patches`` tests one."""

    enabled: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for name in self.enabled:
            PATCHES.get(name)

    @classmethod
    def parse(cls, spec: str | list[str] | tuple[str, ...] | frozenset[str] | None) -> PatchSet:
        if not spec:
            return cls()
        names = spec.split(",") if isinstance(spec, str) else list(spec)
        return cls(frozenset(n.strip() for n in names if n.strip()))

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str):
            PATCHES.get(name)
        return name in self.enabled

    def describe(self) -> list[dict]:
        return [{"name": n, "enabled": n in self.enabled, "description": PATCHES.get(n).description,
                 "bug_class": PATCHES.get(n).bug_class} for n in PATCHES.names()]
