"""Parser variants against the real parsers: a seeded fuzz of DSML outputs, one-shot and streamed
under many chunkings, must give the same (content, calls) as the real code (>= 99.5%)."""

from __future__ import annotations

import pytest
from support.dsml_fuzz import CATEGORIES, TOOLS, fuzz_cases
from support.dsml_fuzz_nested import NESTED_CATEGORIES, NESTED_SPECS, NESTED_TOOLS, nested_cases
from support.parser_diff import compare, sglang_reference, variant_runner
from support.parser_refs import SGLANG_LEAKY_VERSION, SGLANG_VERSION, sglang_detector

from engine.config import EngineConfig
from engine.registry import UnknownVariantError
from engine.text.parsers import PARSERS, get_parser

TARGET = 0.995


@pytest.fixture(scope="module")
def cases():
    out = fuzz_cases(seed=0, n=2400)
    assert len({c.category for c in out}) == len(CATEGORIES) >= 16
    return out


@pytest.mark.slow
@pytest.mark.sglang
def test_sglang_variant_agrees_with_the_real_detector(cases, capsys):
    ours = get_parser("sglang")
    a = compare(cases, sglang_reference(*sglang_detector()),
                variant_runner(ours.parse, ours.streamer))
    with capsys.disabled():
        print("\n" + a.table(f"sglang vs SGLang {SGLANG_VERSION} DeepSeekV32Detector"))
    assert a.rate("one_shot") >= TARGET and a.rate("streamed") >= TARGET, a.misses[:3]
    assert a.chunk_dependent > 0, "the fuzz reaches inputs where SGLang depends on chunking"


@pytest.mark.slow
@pytest.mark.sglang
def test_sglang_leaky_variant_agrees_with_the_real_detector_and_serving(cases, capsys):
    ours = get_parser("sglang-leaky")
    real = sglang_reference(*sglang_detector(SGLANG_LEAKY_VERSION), serving=SGLANG_LEAKY_VERSION)
    a = compare(cases, real, variant_runner(ours.parse, ours.streamer))
    with capsys.disabled():
        print("\n" + a.table(f"sglang-leaky vs SGLang {SGLANG_LEAKY_VERSION} DeepSeekV32Detector"))
    assert a.rate("one_shot") >= TARGET and a.rate("streamed") >= TARGET, a.misses[:3]


@pytest.mark.sglang
def test_the_leaky_sglang_release_leaks_markup_where_the_pinned_one_drops_it(cases):
    """Measured on the real detectors: 0.5.15 returns the whole text when no call parses, 0.5.23
    fails closed; the variants reproduce both counts."""
    old = sglang_reference(*sglang_detector(SGLANG_LEAKY_VERSION), serving=SGLANG_LEAKY_VERSION)
    new = sglang_reference(*sglang_detector(SGLANG_VERSION))
    opener = [c for c in cases if "<｜DSML｜function_calls>" in c.text]
    leaks_old = sum("｜DSML｜" in old[0](c.text)[0] for c in opener)
    leaks_new = sum("｜DSML｜" in new[0](c.text)[0] for c in opener)
    assert leaks_old > 5 * max(1, leaks_new), (leaks_old, leaks_new)
    leaky, sgl = get_parser("sglang-leaky"), get_parser("sglang")
    assert sum(leaky.parse(c.text, TOOLS).leaked for c in opener) == leaks_old
    assert sum(sgl.parse(c.text, TOOLS).leaked for c in opener) == leaks_new


@pytest.mark.slow
def test_vllm_variant_agrees_with_the_real_vllm_parser(cases, vllm_env, capsys):
    """vLLM's parser runs in the vLLM side environment, driven as its chat serving drives it."""
    from support.vllm_parser_run import vllm_reference

    ours = get_parser("vllm")
    a = compare(cases, vllm_reference(cases), variant_runner(ours.parse, ours.streamer))
    with capsys.disabled():
        print("\n" + a.table("vllm vs vLLM 0.32 DeepSeekV32 engine parser"))
    assert a.rate("one_shot") >= TARGET and a.rate("streamed") >= TARGET, a.misses[:3]


@pytest.mark.slow
def test_vllm_variant_agrees_with_the_real_vllm_parser_on_nested_schemas(vllm_env, capsys):
    """Pydantic-style schemas (Optional, enum, ``$ref``, nested objects and arrays): vLLM coerces
    values through each node's own ``properties``/``items`` and reads a bare ``$ref`` as a
    string; the variant must do the same from ``ToolSpec``'s nested ``Schema``."""
    from support.vllm_parser_run import vllm_reference

    cases = nested_cases(seed=0, n=900)  # 1,800 measured 100.00% (docs/engine.md)
    assert len({c.category for c in cases}) == len(NESTED_CATEGORIES) >= 10
    ours = get_parser("vllm")
    a = compare(cases, vllm_reference(cases, tools=NESTED_TOOLS),
                variant_runner(ours.parse, ours.streamer, NESTED_SPECS))
    with capsys.disabled():
        print("\n" + a.table("vllm vs vLLM 0.32 DeepSeekV32 engine parser, nested schemas"))
    assert a.rate("one_shot") >= TARGET and a.rate("streamed") >= TARGET, a.misses[:3]


@pytest.mark.slow
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
    assert PARSERS.names() == ["sglang", "sglang-leaky", "strict", "vllm"]
    assert EngineConfig(tool_parser="sglang").to_dict()["tool_parser"] == "sglang"
    with pytest.raises(UnknownVariantError, match="valid: sglang, sglang-leaky, strict, vllm"):
        EngineConfig(tool_parser="vllm-next")
