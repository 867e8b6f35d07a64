"""The PD engine, one package per concern. Imports only point down ``LAYERS`` (top first);
``tests/test_layout.py`` enforces it:

- ``engine.sim``       simulated bootstrap and transfer behind the ``engine.runtime`` seam
- ``engine.training``  seeded agentic transcripts, training, tool-call evaluation
- ``engine.router``    the PD router (seeded bootstrap rooms, policies, proxying)
- ``engine.disagg``    prefill and decode engines and servers, bootstrap control plane, rooms
- ``engine.serving``   the OpenAI API server of one engine, wire models, prompt planning
- ``engine.http``      the HTTP toolkit all three servers share: errors, limits, metrics, debug
- ``engine.transfer``  NIXL endpoints and the buffer layouts they exchange
- ``engine.core``      the engine loop (normal and overlap steps), scheduler, runner, dumps
- ``engine.cache``     page pools, radix prefix cache, HiCache host tier and loader
- ``engine.model``     the tiny DeepSeek-style model and the no-cache reference
- ``engine.kernels``   torch / Triton kernel sets
- ``engine.config``, ``engine.faults``, ``engine.variants``, ``engine.patch_set``,
  ``engine.patches``, ``engine.runtime``: settings, fault plans, the seam bug variants plug
  into (hooks composed once at construction), the enabled patches, the patch records (one per
  variant, with its mixins), the thread/clock
  seam; shared by everything above
- ``engine.text``      tokenizer, chat template, DSML grammar and tool-call parsers
- ``engine.registry``  the named-variant registry every seam uses

``engine.cli`` (and ``__main__``) sit on top.
"""

from engine.config import EngineConfig

LAYERS = ("__main__", "cli", "sim", "training", "router", "disagg", "serving", "http", "transfer",
          "core", "cache", "model", "kernels", "config", "faults", "variants", "patch_set",
          "patches", "runtime",
          "text", "registry")

__all__ = ["LAYERS", "EngineConfig"]
