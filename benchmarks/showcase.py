"""Shoot the README's two showcase pictures from a demo report in headless Chromium (DevTools, `tests/cdp.py`).

    corelens demo --out runs/demo                 # or `make demo`
    python benchmarks/showcase.py runs/demo/report.html [--out docs/figures]

writes `report-summary.png` (the page's title and findings) and `explorer.png` (the head explorer on the
image task's tab: its top head in panel A, its bottom head in panel B), each as a 256-colour PNG without text
chunks. It refuses a page that names a temporary folder (a throw-away run's path is no reader's).
"""

from __future__ import annotations

import argparse
import io
import re
import shutil
import sys
import tempfile
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the DevTools client the report's tests use

from cdp import Browser  # noqa: E402

TEMPORARY = re.compile(r"/tmp/|pytest-of-|/var/folders/")
WIDTH = 1200  # the page's column is 1100 px: the shots are the page as a desktop reader sees it


def shoot(browser: Browser, selector: str, path: Path, *, max_height: int = 1400) -> Path:
    """Save the element `selector` (its top `max_height` pixels) as a 256-colour PNG at `path`."""
    import base64

    box = browser.evaluate(
        f"(function () {{ var r = document.querySelector({selector!r}).getBoundingClientRect();"
        " return [r.left + window.scrollX, r.top + window.scrollY, r.width, r.height]; })()"
    )
    clip = {
        "x": 0,
        "y": max(0, box[1] - 8),
        "width": WIDTH,
        "height": min(max_height, box[3] + 16),
        "scale": 1,
    }
    shot = browser.call("Page.captureScreenshot", format="png", clip=clip, captureBeyondViewport=True)["data"]
    picture = Image.open(io.BytesIO(base64.b64decode(shot))).convert("RGB")
    picture.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="a demo's report.html (corelens demo --out runs/demo)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "figures", help="folder of the two PNGs")
    parser.add_argument(
        "--task", default="rank-image", help="the explorer's tab (a rank run's folder name) to show"
    )
    args = parser.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        parser.error("needs Chromium (Debian: apt-get install chromium)")
    page = args.report.resolve()
    if TEMPORARY.search(page.read_text(encoding="utf-8")):
        parser.error(
            f"{args.report} names a temporary folder: make the demo under the repository (runs/demo)"
        )
    with tempfile.TemporaryDirectory() as profile:
        browser = Browser(chromium, Path(profile), WIDTH, 1000)
        try:
            for domain in ("Page", "Runtime"):
                browser.call(f"{domain}.enable")
            browser.call(
                "Emulation.setDeviceMetricsOverride",
                width=WIDTH,
                height=1000,
                deviceScaleFactor=1,
                mobile=False,
            )
            browser.call("Page.navigate", url=page.as_uri())
            browser.wait(
                "document.body && document.body.dataset.explorer === 'ready' && !!document.body.dataset.figures"
            )
            args.out.mkdir(parents=True, exist_ok=True)
            print("wrote", shoot(browser, "body", args.out / "report-summary.png", max_height=900))
            browser.click(f'#tasks button[data-task="{args.task}"]')
            bottom = browser.evaluate(
                "(function () { var t = EXPLORER.filter(function (t) { return t.name === "
                f"{args.task!r}; }})[0], last = t.table.slice().sort(function (x, y) "
                "{ return y[5] - x[5]; })[0]; return 'L' + last[0] + 'H' + last[1]; })()"
            )
            browser.click("#compare")
            browser.click(f'#grid td[data-head="{bottom}"]')
            browser.wait(
                "document.querySelectorAll('#panel-a canvas[data-drawn]').length > 0"
                " && document.querySelectorAll('#panel-b canvas[data-drawn]').length > 0"
            )
            print("wrote", shoot(browser, "#explorer", args.out / "explorer.png"))
        finally:
            browser.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
