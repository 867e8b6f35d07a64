"""Parser variants against the real parsers: a seeded fuzz of DSML outputs, one-shot and streamed
under many chunkings, must give the same (content, calls) as the real code (>= 99.5%)."""

from __future__ import annotations

import pytest
from parser_diff import compare, sglang_reference, variant_runner
from parser_refs import SGLANG_VERSION, sglang_detector

from engine.config import EngineConfig
from engine.registry import UnknownVariantError
from engine.text.parsers import PARSERS, get_parser
from workbench.dsml_fuzz import CATEGORIES, TOOLS, fuzz_cases

TARGET = 0.995


@pytest.fixture(scope="module")
def cases():
    out = fuzz_cases(seed=0, n=2400)
    assert len({c.category for c in out}) == len(CATEGORIES) >= 16
    return out


def test_sglang_variant_agrees_with_the_real_detector(cases, capsys):
    ours = get_parser("sglang")
    a = compare(cases, sglang_reference(*sglang_detector()),
                variant_runner(ours.parse, ours.streamer))
    with capsys.disabled():
        print("\n" + a.table(f"sglang vs SGLang {SGLANG_VERSION} DeepSeekV32Detector"))
    assert a.rate("one_shot") >= TARGET and a.rate("streamed") >= TARGET, a.misses[:3]
    assert a.chunk_dependent > 0, "the fuzz reaches inputs where SGLang depends on chunking"


def test_strict_parser_is_chunk_independent_and_differs_from_sglang(cases):
    strict = get_parser("strict")
    a = compare(cases, variant_runner(strict.parse, strict.streamer),
                variant_runner(strict.parse, strict.streamer))
    assert a.rate("streamed") == 1.0 and a.chunk_dependent == 0
    sgl = get_parser("sglang")
    leaks = sum(strict.parse(c.text, None).leaked for c in cases)
    sgl_leaks = sum(sgl.parse(c.text, TOOLS).leaked for c in cases)
    assert leaks > 5 * max(1, sgl_leaks), (leaks, sgl_leaks)  # fail-closed mostly drops markup


def test_parser_registry_is_checked_by_the_config():
    assert PARSERS.names() == ["sglang", "strict"]
    assert EngineConfig(tool_parser="sglang").to_dict()["tool_parser"] == "sglang"
    with pytest.raises(UnknownVariantError, match="valid: sglang, strict"):
        EngineConfig(tool_parser="vllm-next")
