"""Matplotlib helpers for notebook cells; each returns the Figure."""

from __future__ import annotations

import matplotlib.pyplot as plt
import polars as pl
import torch

from workbench.observe.buffers import BufferDiff


def plot_diff_heatmap(diff: BufferDiff, buffer: str = "index_k_f32"):
    """Max abs difference per (layer, position) for one buffer kind."""
    keys = sorted(k for k in diff.per_position if k.name == buffer)
    grid = torch.stack([diff.per_position[k] for k in keys]).numpy()
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(keys) + 1.5))
    im = ax.imshow(grid, aspect="auto", cmap="magma", interpolation="nearest")
    ax.set_yticks(range(len(keys)), [f"layer{k.layer}" for k in keys])
    ax.set_xlabel("token position")
    ax.set_title(f"|dump - reference| for {buffer}")
    fig.colorbar(im, ax=ax, label="max abs diff")
    return fig


def plot_layer_errors(diff: BufferDiff):
    """Bad positions per layer and buffer."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for name, group in diff.summary.group_by("buffer", maintain_order=True):
        g = group.sort("layer")
        ax.plot(g["layer"], g["bad_positions"], marker="o", label=name[0])
    ax.set_xlabel("layer")
    ax.set_ylabel("positions differing from reference")
    ax.legend()
    return fig


def plot_queues(df: pl.DataFrame, role: str = "decode"):
    """Entries per queue over time for one server role; orphaned entries dashed."""
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for (queue,), g in df.filter(pl.col("role") == role).group_by("queue", maintain_order=True):
        ax.step(g["t_s"], g["entries"], where="post", label=queue)
        if g["orphaned"].sum() > 0:
            ax.step(g["t_s"], g["orphaned"], where="post", linestyle="--",
                    label=f"{queue} orphaned")
    ax.set_xlabel("seconds")
    ax.set_ylabel("entries")
    ax.set_title(f"{role} queues")
    ax.legend(fontsize=8)
    return fig


def plot_rates(rows: pl.DataFrame, label: str = "variant"):
    """Flag rate with its confidence interval per variant (columns: variant, rate, lo, hi).
    Error bars never go negative, even when ``lo``/``hi`` miss ``rate`` by a rounding error."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    x = range(len(rows))
    # clipped at 0: an interval computed elsewhere may miss its rate by a rounding error
    err = [(rows["rate"] - rows["lo"]).clip(lower_bound=0.0).to_list(),
           (rows["hi"] - rows["rate"]).clip(lower_bound=0.0).to_list()]
    ax.errorbar(x, rows["rate"], yerr=err, fmt="o", capsize=4)
    ax.set_xticks(list(x), rows[label].to_list(), rotation=20, ha="right")
    ax.set_ylabel("flagged fraction (95% CI)")
    ax.set_ylim(-0.02, 1.02)
    fig.tight_layout()
    return fig


def plot_latency(df: pl.DataFrame):
    """TTFT and E2E distributions of completed requests."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for col in ("ttft_s", "e2e_s"):
        vals = df[col].drop_nulls().to_list()
        if vals:
            ax.hist(vals, bins=20, alpha=0.6, label=col)
    ax.set_xlabel("seconds")
    ax.legend()
    return fig


def plot_bursts(reps):
    """Cumulative flagged requests against seconds since launch, one line per variant."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for rep in reps:
        b = rep.bursts
        ax.step([rep.launch_s, *b["t_s"].to_list()], [0, *b["flagged"].cum_sum().to_list()],
                where="post", marker="o", label=rep.variant)
    ax.set_xlabel("seconds since launch")
    ax.set_ylabel("flagged requests (cumulative)")
    ax.legend()
    fig.tight_layout()
    return fig


def plot_posterior(result, steps: int = 6):
    """Posterior over candidates after selected steps of a bisection (``result.trace``)."""
    trace = result.trace
    last = int(trace["step"].max()) if trace.height else 0
    picks = sorted({round(i * last / max(steps - 1, 1)) for i in range(steps)})
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for step in picks:
        g = trace.filter(pl.col("step") == step)
        ax.plot(g["candidate"].to_list(), g["probability"].to_list(), marker="o",
                label=f"after {step} trials")
    ax.set_ylabel("P(first bad candidate)")
    ax.set_ylim(-0.02, 1.02)
    ax.tick_params(axis="x", rotation=20)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_trial_timeline(history: pl.DataFrame):
    """Which candidate each trial probed, failed trials in red, with the max posterior."""
    fig, ax = plt.subplots(figsize=(8, 3.5))
    names = list(dict.fromkeys(history["candidate"].to_list()))
    y = [names.index(c) for c in history["candidate"]]
    colors = ["tab:red" if f else "tab:green" for f in history["failed"]]
    ax.scatter(history["step"], y, c=colors)
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("trial")
    twin = ax.twinx()
    twin.plot(history["step"], history["max_posterior"], color="gray", linestyle=":")
    twin.set_ylabel("max posterior")
    twin.set_ylim(0, 1.02)
    fig.tight_layout()
    return fig


def plot_metrics(series: pl.DataFrame, names: tuple[str, ...]):
    """One panel per metric name: its value over time, a line per server role."""
    fig, axes = plt.subplots(len(names), 1, figsize=(9, 2.2 * len(names)), sharex=True,
                             squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        for (role,), g in series.filter(pl.col("name") == name).group_by("role",
                                                                          maintain_order=True):
            g = g.group_by("t_s").agg(pl.col("value").sum()).sort("t_s")
            ax.step(g["t_s"], g["value"], where="post", label=role)
        ax.set_ylabel(name.split(":")[-1], fontsize=8)
        ax.legend(fontsize=8, loc="upper right")
    axes[-1, 0].set_xlabel("seconds")
    fig.tight_layout()
    return fig


def plot_trace(run, max_steps: int = 400):
    """The first ``max_steps`` decisions of a simulated schedule (``workbench.sim.SimRun``):
    which thread ran at each step, over virtual time."""
    trace = run.trace[:max_steps]
    names = sorted({d.thread for d in trace}, key=lambda n: (n != "engine", n))
    fig, ax = plt.subplots(figsize=(9, 0.4 * len(names) + 1.5))
    ax.scatter([d.now * 1e3 for d in trace], [names.index(d.thread) for d in trace], s=6)
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("virtual time (ms)")
    ax.set_title(f"seed {run.seed} ({run.strategy}): first {len(trace)} of {len(run.trace)} "
                 "decisions")
    fig.tight_layout()
    return fig
