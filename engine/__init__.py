"""The PD engine, one package per concern (imports only point down this list):

- ``engine.serving``   OpenAI API server, wire models, prompt planning, metrics, debug routes
- ``engine.router``    the PD router (seeded bootstrap rooms, policies, proxying)
- ``engine.disagg``    prefill and decode engines, bootstrap control plane, room states
- ``engine.transfer``  NIXL endpoints and the buffer layouts they exchange
- ``engine.core``      the engine loop (normal and overlap steps), scheduler, runner, dumps
- ``engine.cache``     page pools, radix prefix cache, HiCache host tier and loader
- ``engine.model``     the tiny DeepSeek-style model and the no-cache reference
- ``engine.kernels``   torch / Triton kernel sets
- ``engine.text``      tokenizer, chat template, DSML grammar and tool-call parser
- ``engine.training``  seeded agentic transcripts, training, tool-call evaluation

``engine.config``, ``engine.patches``, ``engine.faults`` and ``engine.registry`` are shared by all.
"""

from engine.config import EngineConfig

__all__ = ["EngineConfig"]
