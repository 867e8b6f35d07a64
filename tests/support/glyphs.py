"""Reads a screenshot of one rendered character: a vertical bar, or a box (tofu)?

A missing glyph is drawn as a rectangle outline (two tall vertical edges joined by two wide
horizontal ones); U+FF5C drawn from a font that has it is one tall stroke and no wide row.
"""

from __future__ import annotations

import io
from collections import Counter
from dataclasses import dataclass

from PIL import Image

INK = 90  # grey levels from the background that count as ink


@dataclass(frozen=True)
class GlyphShape:
    width: int
    height: int
    tall_strokes: int  # groups of adjacent columns with an ink run over most of the height
    wide_rows: int  # rows with an ink run over 0.4 of the character box
    tallest_run: int

    @property
    def is_bar(self) -> bool:
        return self.tall_strokes == 1 and self.wide_rows == 0

    @property
    def is_box(self) -> bool:
        return self.tall_strokes >= 2 and self.wide_rows >= 2


def _longest_run(values: list[bool]) -> int:
    best = cur = 0
    for v in values:
        cur = cur + 1 if v else 0
        best = max(best, cur)
    return best


def shape_of(png: bytes, tall: float = 0.5) -> GlyphShape:
    """The strokes of the ink in ``png`` (a clip around one character)."""
    img = Image.open(io.BytesIO(png)).convert("L")
    w, h = img.size
    px = img.load()
    bg = Counter(px[x, y] for x in range(w) for y in range(h)).most_common(1)[0][0]
    ink = [[abs(px[x, y] - bg) > INK for x in range(w)] for y in range(h)]
    cols = [_longest_run([ink[y][x] for y in range(h)]) for x in range(w)]
    # the glyph's own height: the ink's vertical extent, not the line box around it
    rows_inked = [y for y in range(h) if any(ink[y])]
    glyph_h = (rows_inked[-1] - rows_inked[0] + 1) if rows_inked else 0
    tall_cols = [c >= max(3, tall * glyph_h) for c in cols]
    strokes = sum(1 for x in range(w) if tall_cols[x] and (x == 0 or not tall_cols[x - 1]))
    # wide against the character's box (the clip): a bar's stroke is a small part of it
    wide = sum(1 for y in range(h) if _longest_run(ink[y]) >= max(4, 0.4 * w))
    return GlyphShape(w, h, strokes, wide, max(cols, default=0))


# the first U+FF5C inside a DSML special token of the explorer's static rendering: its box in
# document coordinates (a Range around that one character)
MARKER_PROBE = """(() => {
  const el = [...document.querySelectorAll('.wb-explorer .wb-special')]
    .find(e => e.textContent.includes('\\uff5c'));
  if (!el) return null;
  const node = el.firstChild, i = node.textContent.indexOf('\\uff5c');
  const r = document.createRange(); r.setStart(node, i); r.setEnd(node, i + 1);
  el.scrollIntoView({block: 'center'});
  const b = r.getBoundingClientRect();
  return {x: b.x + window.scrollX, y: b.y + window.scrollY, width: b.width, height: b.height,
          font: getComputedStyle(el).fontFamily, text: el.textContent};
})()"""


def marker_shape(browser, page, png_path, timeout: float = 60.0) -> tuple[GlyphShape, dict]:
    """Opens ``page`` (an HTML file) in ``browser``, screenshots the marker's character at 4x into
    ``png_path`` and reads its shape."""
    import base64
    from pathlib import Path

    browser.navigate(Path(page).resolve().as_uri())
    browser.wait_for("document.readyState === 'complete' && document.fonts.ready.then(() => true)",
                     timeout, "the report to load")
    rect = browser.wait_for(MARKER_PROBE, timeout, "a DSML marker in the explorer's static view")
    clip = {k: rect[k] for k in ("x", "y", "width", "height")}
    data = browser.send("Page.captureScreenshot", format="png", clip={**clip, "scale": 4})["data"]
    png = base64.b64decode(data)
    Path(png_path).write_bytes(png)
    return shape_of(png), rect
