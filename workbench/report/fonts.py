"""The font reports carry, so DSML markup is legible on a machine without CJK fonts.

DSML markers use U+FF5C (FULLWIDTH VERTICAL LINE) and the tokenizer's specials U+2581; a browser
with no CJK font draws U+FF5C as a box. ``font_face_css()`` embeds (base64, WOFF) a subset of
matplotlib's DejaVu Sans Mono covering every character of the model's vocabulary and of the DSML
markers, with a U+FF5C glyph made from its '|' centred in a full-width advance. The face is
declared with a ``unicode-range`` of the non-ASCII characters only, and prepended to the code and
content font stacks, so ASCII keeps the page's own fonts and only the markers use it.

Invariant: ``covered()`` holds every character ``vocab_chars()`` lists (checked by the tests).
"""

from __future__ import annotations

import base64
import functools
import io
from pathlib import Path

FAMILY = "WB DSML Mono"
FULLWIDTH_BAR = 0xFF5C


def vocab_chars() -> frozenset[str]:
    """Every character the model can emit (its tokenizer vocabulary) or the DSML grammar uses."""
    from engine.text import Tokenizer
    from engine.text.dsml_grammar import LEAK_MARKERS

    chars = set("".join(Tokenizer().itos)) | set("".join(LEAK_MARKERS))
    return frozenset(c for c in chars if c.isprintable())


def source_font() -> Path:
    import matplotlib

    return Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSansMono.ttf"


def _add_fullwidth_bar(font) -> None:
    """Adds U+FF5C: the '|' outline shifted to the centre of a double advance (the CJK width)."""
    from fontTools.pens.recordingPen import DecomposingRecordingPen
    from fontTools.pens.transformPen import TransformPen
    from fontTools.pens.ttGlyphPen import TTGlyphPen

    glyphs, cmap = font.getGlyphSet(), font.getBestCmap()
    bar = cmap[ord("|")]
    adv, _ = font["hmtx"][bar]
    rec = DecomposingRecordingPen(glyphs)
    glyphs[bar].draw(rec)
    pen = TTGlyphPen(None)
    rec.replay(TransformPen(pen, (1, 0, 0, 1, adv // 2, 0)))
    name = "uniFF5C"
    font.setGlyphOrder([*font.getGlyphOrder(), name])
    font["glyf"][name] = pen.glyph()
    font["hmtx"][name] = (2 * adv, font["hmtx"][bar][1] + adv // 2)
    for table in font["cmap"].tables:
        if table.isUnicode():
            table.cmap[FULLWIDTH_BAR] = name


@functools.cache
def subset_font(chars: frozenset[str] | None = None) -> bytes:
    """WOFF bytes of DejaVu Sans Mono subset to ``chars`` (default ``vocab_chars()``), with the
    full-width bar added when the source lacks it."""
    from fontTools.subset import Options, Subsetter
    from fontTools.ttLib import TTFont

    chars = vocab_chars() if chars is None else chars
    font = TTFont(source_font())
    if FULLWIDTH_BAR not in font.getBestCmap():
        _add_fullwidth_bar(font)
    opts = Options()
    opts.flavor = "woff"
    opts.name_IDs = ["*"]
    opts.notdef_outline = True
    opts.drop_tables = [*opts.drop_tables, "FFTM"]  # FontForge's timestamps
    sub = Subsetter(opts)
    sub.populate(unicodes=[ord(c) for c in chars])
    sub.subset(font)
    out = io.BytesIO()
    font.flavor = "woff"
    font.save(out)
    return out.getvalue()


def covered(data: bytes | None = None) -> frozenset[str]:
    """The characters the (default) subset font maps to a glyph with an outline or advance."""
    from fontTools.ttLib import TTFont

    font = TTFont(io.BytesIO(data or subset_font()))
    return frozenset(chr(c) for c in font.getBestCmap())


def unicode_range(chars: frozenset[str]) -> str:
    """CSS ``unicode-range`` of the non-ASCII ``chars`` (ASCII stays with the page's fonts)."""
    points = sorted(ord(c) for c in chars if ord(c) > 0x7E)
    return ", ".join(f"U+{p:04X}" for p in points)


@functools.cache
def font_face_css() -> str:
    """A ``<style>`` block: the embedded face and the code/content font stacks that use it."""
    data = base64.b64encode(subset_font()).decode()
    stack = f"'{FAMILY}', Menlo, Consolas, 'DejaVu Sans Mono', monospace"
    return (f"<style>@font-face {{ font-family: '{FAMILY}'; "
            f"src: url(data:font/woff;base64,{data}) format('woff'); "
            f"unicode-range: {unicode_range(covered())}; }}\n"
            f":root {{ --jp-code-font-family: {stack}; --jp-content-font-family: '{FAMILY}', "
            "system-ui, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; }\n"
            f"pre, code, .highlight, .wb-view {{ font-family: {stack}; }}</style>")


def embed_fonts(html: str) -> str:
    """``html`` (a whole page) with ``font_face_css()`` at the end of its head (idempotent)."""
    if f"font-family: '{FAMILY}'" in html:
        return html
    css = font_face_css()
    at = html.find("</head>")
    return html[:at] + css + html[at:] if at >= 0 else css + html
