"""Export a Hugging Face model folder (``LlamaForCausalLM``) that real engines serve as-is.

The folder holds ``config.json``, ``model.safetensors`` (fp32, tied embeddings),
``tokenizer.json`` (a ``tokenizers`` character-level BPE with no merges whose ids equal
``engine.text.tokenizer``'s), ``tokenizer_config.json`` with a Jinja chat template that renders
messages and tools exactly like ``engine.text.chat.render_prompt`` (tool-call arguments must
arrive as mappings, as vLLM passes them), and ``generation_config.json``. Control tokens are
special (skipped on decode); DSML markers are plain added tokens, so they reach the text a tool
parser reads.
"""

from __future__ import annotations

import json
from pathlib import Path

from engine.config import ModelConfig
from engine.text import tokenizer as T
from engine.training.llama import TinyLlama, hf_state_dict

CHAT_TEMPLATE = (  # newlines are emitted as {{ NL }} so that {%- never eats one
    "{%- set NL = '\\n' -%}"
    "{%- set short = {'string': 'str', 'integer': 'int', 'number': 'num', 'boolean': 'bool'} -%}"
    "{{- bos_token }}{{ 'Tools: ' }}"
    "{%- for t in tools or [] %}{% if not loop.first %}; {% endif %}{{ t.function.name }}("
    "{%- for k, v in ((t.function.parameters or {}).properties or {}).items() -%}"
    "{% if not loop.first %}, {% endif %}{{ k }}:{{ short.get(v.get('type', 'string'), 'str') }}"
    "{%- endfor %})"
    "{%- endfor %}{{ NL }}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' %}{{ m.content or '' }}{{ NL }}"
    "{%- elif m.role == 'user' %}<｜User｜>{{ m.content or '' }}"
    "{%- elif m.role == 'tool' %}<｜tool▁output｜>{{ m.content or '' }}"
    "{%- elif m.role == 'assistant' %}<｜Assistant｜>{{ m.content or '' }}"
    "{%- if m.tool_calls %}<｜DSML｜function_calls>{{ NL }}"
    "{%- for c in m.tool_calls %}<｜DSML｜invoke name=\"{{ c.function.name }}\">{{ NL }}"
    "{%- for k, v in c.function.arguments.items() %}<｜DSML｜parameter name=\"{{ k }}"
    "{%- if v is string %}\" string=\"true\">{{ v }}"
    "{%- else %}\" string=\"false\">{{ v | tojson }}{% endif %}</｜DSML｜parameter>{{ NL }}"
    "{%- endfor %}</｜DSML｜invoke>{{ NL }}"
    "{%- endfor %}</｜DSML｜function_calls>"
    "{%- endif %}<｜end▁of▁sentence｜>"
    "{%- else %}{{ raise_exception('unknown role ' + m.role) }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<｜Assistant｜>{% endif -%}"
)


def tokenizer_json() -> dict:
    """The ``tokenizers`` serialization of ``engine.text.tokenizer.Tokenizer`` (same ids)."""
    from tokenizers import AddedToken, Tokenizer, decoders
    from tokenizers.models import BPE

    tk = T.Tokenizer()
    vocab = {s: i for i, s in enumerate(tk.itos)}
    out = Tokenizer(BPE(vocab=vocab, merges=[], unk_token=T.UNK_CHAR))
    out.decoder = decoders.Fuse()
    out.add_tokens([AddedToken(s, special=s in T.CONTROL_TOKENS, normalized=False)
                    for s in T.SPECIAL_TOKENS])
    data = json.loads(out.to_str())
    assert [a["id"] for a in data["added_tokens"]] == list(range(len(T.SPECIAL_TOKENS)))
    return data


def tokenizer_config() -> dict:
    return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": T.BOS, "eos_token": T.EOS,
            "pad_token": T.PAD, "unk_token": T.UNK_CHAR,
            "model_max_length": ModelConfig().max_seq_len,
            "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE}


def hf_config(cfg: ModelConfig) -> dict:
    tk = T.Tokenizer()
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
            "intermediate_size": cfg.d_ff, "num_hidden_layers": cfg.n_layers,
            "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_heads,
            "head_dim": cfg.head_dim, "hidden_act": "silu",
            "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps,
            "rope_theta": cfg.rope_theta, "tie_word_embeddings": True, "attention_bias": False,
            "mlp_bias": False, "torch_dtype": "float32", "bos_token_id": tk.bos_id,
            "eos_token_id": tk.eos_id, "pad_token_id": tk.pad_id}


def export(model: TinyLlama, meta: dict, out: Path) -> None:
    """Writes the Hugging Face folder for ``model`` (see the module docstring)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(hf_state_dict(model), str(out / "model.safetensors"), metadata={"format": "pt"})
    files = {"config.json": hf_config(model.cfg), "tokenizer.json": tokenizer_json(),
             "tokenizer_config.json": tokenizer_config(),
             "special_tokens_map.json": {"bos_token": T.BOS, "eos_token": T.EOS,
                                         "pad_token": T.PAD, "unk_token": T.UNK_CHAR},
             "generation_config.json": {"bos_token_id": T.Tokenizer().bos_id,
                                        "eos_token_id": T.Tokenizer().eos_id},
             "train_meta.json": meta}
    for name, data in files.items():
        (out / name).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
