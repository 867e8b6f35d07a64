"""The claims of a crash study (notebook 08): each condition's death rate with its interval, the
AMX hypothesis as checks that can fail (per-pair prediction against outcome), and NIXL's
transfer times. Rows come from ``crash_study.read_outcomes``."""

from __future__ import annotations

from dataclasses import asdict

import polars as pl

from workbench.deploy.isa import IsaProbe
from workbench.judge import FindingDraft
from workbench.studies.crash_study import Host, rates


def findings(outcomes: pl.DataFrame, probe: IsaProbe, here: Host,
             min_pairs: int = 12) -> list[FindingDraft]:
    """The study's claims: each condition's death rate with its interval, the cause as far as
    measured (the ISA probe against where and how pairs died), and NIXL's transfer times."""
    return [_rate_claim(outcomes, min_pairs), _cause_claim(outcomes, probe, here),
            _transfer_claim(outcomes)]


def _rate_claim(outcomes: pl.DataFrame, min_pairs: int) -> FindingDraft:
    table = rates(outcomes)
    arms = "; ".join(f"{r['condition']} {r['died']}/{r['pairs']} (95% CI {r['lo']:.2f}-"
                     f"{r['hi']:.2f})" for r in table.iter_rows(named=True))
    cpus = sorted(set(outcomes["cpu"]))
    flags = sorted(set(outcomes["flags"]))
    title = (f"{int(table['died'].sum())} of {len(outcomes)} fresh vLLM PD pairs lost a process "
             f"under notebook 06's load on {', '.join(cpus)} (ISA flags: {', '.join(flags)}): "
             f"{arms}")
    checks = {f"at_least_{min_pairs}_pairs_per_condition": bool(table["pairs"].min() >= min_pairs),
              "host_recorded_for_every_pair": bool((outcomes["cpu"] != "").all())}
    return FindingDraft(title, checks, {"rates": table, "hosts": cpus, "flags": flags})


def _cause_claim(outcomes: pl.DataFrame, probe: IsaProbe, here: Host) -> FindingDraft:
    """The AMX hypothesis as checks that can fail: no pair the per-pair prediction called safe
    died by SIGILL, no pair with the grant died by SIGILL, and every granted worker on an AMX
    kernel held the permission (read inside it)."""
    o = _amx_columns(outcomes)
    sigill = o.filter(pl.col("died") & (pl.col("signal") == "SIGILL"))
    predicted = o.filter(pl.col("predicted_sigill").is_not_null())
    safe_died = sigill.filter(pl.col("predicted_sigill") == False)  # noqa: E712
    granted = o.filter(pl.col("amx_grant"))
    granted_amx = granted.filter(pl.col("attn_isa") == "amx")
    unpermitted = granted_amx.filter(pl.col("workers_unpermitted") > 0)
    isa = (f"on {here.cpu} vLLM picks its '{probe.attn_isa_bf16}' attention kernel for bf16 "
           f"(AMX advertised: {probe.amx_advertised}; a fresh vLLM process holds the tile "
           f"permission: {probe.amx_permitted_after_import} with the site hook's grant "
           f"'{probe.grant}'); {probe.vllm_calls_init_amx} vLLM source files ask for it")
    arms = "; ".join(f"{'granted' if g else 'ungranted'} {int(grp['sigill'].sum())}/{len(grp)} "
                     f"SIGILL" for (g,), grp in o.with_columns(
                         sigill=pl.col("died") & (pl.col("signal") == "SIGILL")).group_by(
                         ["amx_grant"], maintain_order=True))
    title = (f"SIGILL deaths by AMX grant: {arms}; per-pair predictions on {len(predicted)} of "
             f"{len(o)} pairs, {len(safe_died)} predicted safe and died by SIGILL; {isa}")
    checks = {"isa_probe_ran": True,
              "no_sigill_where_predicted_safe": len(safe_died) == 0,
              "no_sigill_with_the_grant": len(sigill.filter(pl.col("amx_grant"))) == 0,
              "granted_workers_hold_the_permission": len(unpermitted) == 0}
    evidence = {"probe": asdict(probe), "host": asdict(here), "amx_host_pairs": len(
        o.filter(pl.col("attn_isa") == "amx")), "deaths": o.filter(pl.col("died")).drop("stack")}
    return FindingDraft(title, checks, evidence)


def _amx_columns(outcomes: pl.DataFrame) -> pl.DataFrame:
    """Rows recorded before the grant existed (no ``amx_grant``) ran without it."""
    defaults = {"amx_grant": pl.lit(False), "attn_isa": pl.lit(""),
                "predicted_sigill": pl.lit(None, pl.Boolean), "workers_unpermitted": pl.lit(0)}
    return outcomes.with_columns(**{k: v for k, v in defaults.items()
                                    if k not in outcomes.columns})


def _transfer_claim(outcomes: pl.DataFrame, stall_s: float = 1.0) -> FindingDraft:
    timed = outcomes.filter(pl.col("xfer_p90_s").is_not_null())
    per = {c: {"pairs": len(g), "stalled": int((g["xfer_p90_s"] > stall_s).sum()),
               "worst_p90_s": round(float(g["xfer_p90_s"].max()), 3)}
           for (c,), g in timed.group_by(["condition"], maintain_order=True)}
    arms = "; ".join(f"{c} {v['stalled']}/{v['pairs']} (worst {v['worst_p90_s']} s)"
                     for c, v in per.items())
    stalled = sum(v["stalled"] for v in per.values())
    verdict = "still stall on some pairs" if stalled else "no longer stall"
    title = (f"vLLM's NIXL transfers {verdict} with the progress thread paced: pairs whose p90 "
             f"transfer time exceeds {stall_s:g} s: {arms}; issue 12 saw a 5 s p90 on an idle "
             f"pair")
    return FindingDraft(title, {"transfers_timed": len(timed) > 0},
                        {"by_condition": per, "median_p90_s": timed["xfer_p90_s"].median(),
                         "untimed_pairs": len(outcomes) - len(timed)})
