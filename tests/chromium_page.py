"""A report as a browser lays it out: headless Chromium's screenshot and measurements of the page.

`measure(page, width)` opens a copy of the page with a script that, once laid out, writes what a
reader sees into the DOM (the page's scroll width against the window, each checked element's box,
the boxes that scroll on their own, the figures' widths); `--dump-dom` hands that back. The
screenshot is the same layout, for a person to look at (tests keep it beside their output).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--virtual-time-budget=3000"]

_PROBE = """
<script>
window.addEventListener('load', () => {
  const box = el => { const r = el.getBoundingClientRect();
    return {id: el.id || null, tag: el.tagName.toLowerCase(), cls: el.className && String(el.className) || null,
            left: r.left, right: r.right, width: r.width, height: r.height,
            scrollWidth: el.scrollWidth, clientWidth: el.clientWidth,
            overflowX: getComputedStyle(el).overflowX, text: (el.innerText || '').slice(0, 8000)}; };
  const out = {
    window: window.innerWidth,
    page: document.documentElement.scrollWidth,
    ids: Object.fromEntries([...document.querySelectorAll('[id]')].map(e => [e.id, box(e)])),
    tables: [...document.querySelectorAll('table')].map(t => {
      let p = t.parentElement, scroller = null;
      while (p && p !== document.body) { const o = getComputedStyle(p).overflowX;
        if (o === 'auto' || o === 'scroll') { scroller = box(p); break; } p = p.parentElement; }
      return {...box(t), scroller}; }),
    figures: [...document.querySelectorAll('figure svg, figure img')].map(box),
    first: (document.querySelector('main, body').innerText || '').trim().slice(0, 300),
  };
  window.parent.postMessage(JSON.stringify(out), '*');
});
</script>
"""
# Chromium's window is at least 500 px wide, so a phone-width page is laid out in a frame of that width;
# the frame's page tells its measurements to this one, whose DOM --dump-dom returns.
_FRAME = """<!DOCTYPE html><html><head><meta charset='utf-8'></head><body style='margin:0'>
<iframe src='{src}' style='width:{width}px;height:{height}px;border:0;display:block'></iframe>
<pre id='mlrepro-measure'></pre>
<script>window.addEventListener('message', e => {{ document.getElementById('mlrepro-measure').textContent = e.data; }});</script>
</body></html>"""


def _run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                              text=True, timeout=timeout, env={**os.environ, "HOME": profile})


def available() -> bool:
    return Path(CHROMIUM).exists()


def _framed(page: Path, width: int, height: int, probe: bool) -> tuple[Path, Path]:
    """Beside the original (so that its relative links resolve): the page, probed, and a frame of it."""
    page = Path(page)
    text = page.read_text()
    if probe:
        text = re.sub(r"</body>", lambda _: _PROBE + "</body>", text, count=1) if "</body>" in text else text + _PROBE
    copy = page.with_name(f".{page.stem}.{width}.view.html")
    copy.write_text(text)
    frame = page.with_name(f".{page.stem}.{width}.frame.html")
    frame.write_text(_FRAME.format(src=copy.name, width=width, height=height))
    return copy, frame


def screenshot(page: Path, out_png: Path, width: int, height: int = 800) -> Path:
    """The first screen of `page` in a window `width` pixels wide, as a PNG of that width."""
    copy, frame = _framed(page, width, height, probe=False)
    try:
        proc = _run([f"--screenshot={out_png}", f"--window-size={max(width, 500)},{height}", frame.resolve().as_uri()])
    finally:
        copy.unlink(missing_ok=True)
        frame.unlink(missing_ok=True)
    if not Path(out_png).is_file():
        raise RuntimeError(f"chromium made no screenshot of {page}: {proc.stderr[-2000:]}")
    if width < 500:
        from PIL import Image

        with Image.open(out_png) as image:
            image.crop((0, 0, width, height)).save(out_png)
    return Path(out_png)


def measure(page: Path, width: int, height: int = 800) -> dict:
    """What the page looks like `width` pixels wide (see the module's docstring)."""
    copy, frame = _framed(page, width, height, probe=True)
    try:
        proc = _run(["--dump-dom", f"--window-size={max(width, 500)},{height}", frame.resolve().as_uri()])
    finally:
        copy.unlink(missing_ok=True)
        frame.unlink(missing_ok=True)
    found = re.search(r"<pre id=\"mlrepro-measure\">(.+?)</pre>", proc.stdout, re.S)
    if not found:
        raise RuntimeError(f"chromium did not lay out {page}: {proc.stderr[-2000:]}")
    import html

    return json.loads(html.unescape(found.group(1)))
