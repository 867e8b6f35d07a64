"""Training entry point: ``python -m engine.training.train --steps N --seed S --out data/model``.

Deterministic from the seed on a given thread count: data order, init and dropout-free updates all
derive from ``--seed``. Phase 1 trains dense attention (indexer learns by KL toward the detached
dense attention); phase 2 switches attention to the indexer's top-k selection.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.config import ModelConfig
from engine.model import TinyDeepSeek
from engine.text import tokenizer as T
from engine.training.datagen import EVAL_SEED_BASE, make_transcript

log = logging.getLogger(__name__)


def assistant_mask(ids: list[int], tk: T.Tokenizer) -> list[bool]:
    """True for tokens inside assistant turns (after the Assistant tag, through EOS)."""
    asst, eos = tk.stoi[T.ASSISTANT], tk.eos_id
    out, inside = [], False
    for i in ids:
        out.append(inside)
        if i == asst:
            inside = True
        elif i == eos:
            inside = False
    return out


def make_batch(seeds: list[int], tk: T.Tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns tokens [B,T] (pad-filled) and loss mask [B,T-1] over next-token targets."""
    seqs = [tk.encode(make_transcript(s).text()) for s in seeds]
    width = max(map(len, seqs))
    tokens = torch.full((len(seqs), width), tk.pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for row, ids in enumerate(seqs):
        tokens[row, : len(ids)] = torch.tensor(ids)
        mask[row, : len(ids)] = torch.tensor(assistant_mask(ids, tk))
    return tokens, mask[:, 1:]


def lr_at(step: int, total: int, peak: float, warmup: int = 100) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))


def train(steps: int, seed: int, batch: int, lr: float, dense_frac: float,
          cfg: ModelConfig, checkpoint: Path | None = None,
          model: torch.nn.Module | None = None) -> tuple[torch.nn.Module, dict]:
    """Trains ``model`` (default: a fresh ``TinyDeepSeek(cfg)``) on seeded transcripts."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tk = T.Tokenizer()
    model = model if model is not None else TinyDeepSeek(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    t0, history = time.time(), []
    for step in range(steps):
        tokens, mask = make_batch([rng.randrange(EVAL_SEED_BASE) for _ in range(batch)], tk)
        logits, kl = model(tokens, sparse=step >= dense_frac * steps)
        ce = F.cross_entropy(logits[:, :-1][mask], tokens[:, 1:][mask])
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr)
        opt.zero_grad(set_to_none=True)
        (ce + kl).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            history.append({"step": step, "ce": round(ce.item(), 4), "kl": round(kl.item(), 4)})
            log.info("step %d ce %.4f kl %.4f %.0fs", step, ce.item(), kl.item(), time.time() - t0)
        if checkpoint is not None and step % 250 == 249:
            save(model, {"step": step, "history": history}, checkpoint)
    meta = {"steps": steps, "seed": seed, "batch": batch, "lr": lr, "dense_frac": dense_frac,
            "train_seconds": round(time.time() - t0, 1), "threads": torch.get_num_threads(),
            "params": sum(p.numel() for p in model.parameters()), "history": history}
    return model.eval(), meta


def save(model: torch.nn.Module, meta: dict, out: Path) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(model.cfg.to_dict(), indent=1))
    (out / "train_meta.json").write_text(json.dumps(meta, indent=1))


def train_llama(args) -> None:
    """The Llama real engines serve: warm-started from ``--init`` (a tiny-DeepSeek folder) or
    fresh, trained dense, exported as a Hugging Face folder (``engine.training.hf``)."""
    from engine.model import load_model
    from engine.training.hf import export
    from engine.training.llama import TinyLlama, from_deepseek

    cfg = ModelConfig()
    if args.init is not None:
        model = from_deepseek(load_model(args.init / "model.safetensors"))
    else:
        torch.manual_seed(args.seed)
        model = TinyLlama(cfg)
    model, meta = train(args.steps, args.seed, args.batch, args.lr, 0.0, cfg, args.checkpoint,
                        model=model)
    meta = {**meta, "arch": "llama", "init": str(args.init) if args.init else None}
    meta.pop("dense_frac")
    export(model, meta, args.out)
    log.info("exported %s (%d params, %.0fs)", args.out, meta["params"], meta["train_seconds"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--dense-frac", type=float, default=0.3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("data/model"))
    ap.add_argument("--checkpoint", type=Path, default=None, help="folder for periodic saves")
    ap.add_argument("--arch", choices=("deepseek", "llama"), default="deepseek",
                    help="llama: a Hugging Face Llama for real engines (train_llama)")
    ap.add_argument("--init", type=Path, default=None,
                    help="llama: warm-start from this tiny-DeepSeek model folder")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    if args.arch == "llama":
        train_llama(args)
        return
    model, meta = train(args.steps, args.seed, args.batch, args.lr, args.dense_frac, ModelConfig(),
                        args.checkpoint)
    save(model, meta, args.out)
    log.info("saved to %s (%d params, %.0fs)", args.out, meta["params"], meta["train_seconds"])


if __name__ == "__main__":
    main()
