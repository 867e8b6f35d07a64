"""The Hugging Face export real engines serve: weights, tokenizer and config (issue 12)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer as HFTokenizer

from engine.config import ModelConfig
from engine.text import tokenizer as T
from engine.training import make_transcript
from engine.training.hf import hf_config, tokenizer_json
from engine.training.llama import TinyLlama, from_deepseek, hf_state_dict

LLAMA = Path(__file__).resolve().parents[1] / "data" / "llama"


def test_llama_warm_start_keeps_dense_attention_exact(shipped_model):
    """Interleaved -> half-split RoPE is a permutation of q/k rows: with the previous-token
    embedding zeroed, the Llama computes the DeepSeek's dense forward."""
    src = copy.deepcopy(shipped_model)
    with torch.no_grad():
        src.prev_emb.weight.zero_()
    dst = from_deepseek(src)
    tokens = torch.randint(0, 111, (2, 37), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, _ = src(tokens, sparse=False)
        got, _ = dst(tokens)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_tokenizer_json_gives_our_ids_and_round_trips():
    hf = HFTokenizer.from_str(json.dumps(tokenizer_json()))
    ours = T.Tokenizer()
    for seed in range(60):
        text = make_transcript(seed).text() + " odd: \u00e9 <|x|> \"> <\uff5cDSML\uff5c"
        ids = hf.encode(text, add_special_tokens=False).ids
        assert ids == ours.encode(text)
        assert hf.decode(ids, skip_special_tokens=False) == ours.decode(ids)
    control = [ours.stoi[t] for t in T.CONTROL_TOKENS]
    dsml = [ours.stoi[T.FC_OPEN], ours.stoi[T.INVOKE_OPEN]]
    assert hf.decode(control + dsml, skip_special_tokens=True) == T.FC_OPEN + T.INVOKE_OPEN


def test_shipped_llama_folder_is_a_consistent_hf_model():
    cfg = json.loads((LLAMA / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["tie_word_embeddings"]
    weights = load_file(str(LLAMA / "model.safetensors"))
    model = TinyLlama(ModelConfig())
    assert set(weights) == set(hf_state_dict(model))
    assert cfg == hf_config(model.cfg)
    assert json.loads((LLAMA / "tokenizer.json").read_text()) == tokenizer_json()
    meta = json.loads((LLAMA / "train_meta.json").read_text())
    assert meta["arch"] == "llama" and meta["seed"] == 0
