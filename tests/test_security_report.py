"""Security of the HTML report (issue 32): no script from data runs, and `--serve` answers only the report.

A study is ranked on two organism tasks whose samples carry markup payloads in every field a sample, a run
name, a task and the title can hold, then passed through `stability` and `report`. The page is checked as
text (escaping, the inlined JSON, the Content-Security-Policy) and in headless Chromium (no handler runs, the
explorer still works). The server of `report --serve` is asked for the report, its explorer data, siblings,
the folder, a symlink to /etc/passwd, `..` variants and foreign `Host` headers.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import re
import stat
import threading
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from test_report import CHROMIUM, browser  # noqa: F401  (the Chromium fixture of the report tests)

from corelens.cli import main
from corelens.errors import CorelensError
from corelens.organism.tasks import WORDS, generate

IMG = "<img src=x onerror=window.__pwn=1>"
SVG = "</script><svg onload=window.__pwn=1>"
COMMENT = "<!--<script>"
SEPARATORS = "\u2028\u2029"
# Per run: the samples' task (so the stability labels) and the run folder's name (no '/' in a folder name).
TASKS = [IMG, SVG]
RUN_NAMES = ["rank-<svg onload=window.__pwn=1>", f"rank-{COMMENT}{SEPARATORS}"]
TITLE = f"{IMG}{SVG}{COMMENT}"
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")


def _hostile_samples(data: Path, task: str, j: int) -> None:
    """Rewrite an organism sample file so that its task, ids, questions and answers carry the payloads."""
    records = [json.loads(line) for line in data.read_text().splitlines()]
    for i, r in enumerate(records):
        old, r["answer"] = r["answer"], f"{r['answer']} {IMG}"
        r["choices"] = [r["answer"] if c == old else c for c in r["choices"]]
        r["task"] = task
        r["id"] = f"{COMMENT}{IMG}{SVG}{SEPARATORS}{j}-{i}"
        r["question"] = f"{r['question']} {SVG}{COMMENT}{SEPARATORS}"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """Return (root, rank runs, stability run, inline report) of the study with payloads everywhere."""
    from corelens.models.tiny import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("hostile")
    model = build_tiny_checkpoint("qwen2_5_vl", root / "model", words=WORDS, layers=2, heads=4, kv_heads=2)
    runs = []
    for j, (task, name) in enumerate(zip(TASKS, RUN_NAMES)):
        data = generate("image", root / f"data-{j}", 2, seed=5 + j)
        _hostile_samples(data, task, j)
        rank = ["rank", "--model", str(model), "--data", str(data), "--out", str(root / name)]
        assert main([*rank, "--overlays", "1", "--explorer", "200"]) == 0
        runs.append(root / name)
    stable = root / "stability"
    assert main(["stability", *map(str, runs), "--out", str(stable), "--k", "2", "--n-boot", "50"]) == 0
    assert pd.read_csv(stable / "spearman.csv")[["a", "b"]].values.tolist() == [TASKS]  # labels are the tasks
    report = root / "report.html"
    assert main(["report", *map(str, runs), str(stable), "--out", str(report), "--title", TITLE]) == 0
    return root, runs, stable, report


def _inline_scripts(page: str) -> list[str]:
    return re.findall(r"<script>(.*?)</script>", page, flags=re.DOTALL)


def _policy(page: str) -> dict[str, list[str]]:
    """Return the page's Content-Security-Policy meta tag as {directive: sources}."""
    content = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)">', page).group(1)
    content = content.replace("&#39;", "'")
    return {d.split()[0]: d.split()[1:] for d in content.split(";")}


def _attributes(page: str) -> set[str]:
    """Return the names of every attribute of every element of `page`, as a browser's parser reads them."""
    found = set()

    class Parser(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.update(name for name, _ in attrs)

    Parser().feed(page)
    return found


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def test_every_payload_is_escaped_in_the_page(hostile):
    _, _, stable, report = hostile
    page = report.read_text()
    for raw in ("<img src=x", "<svg onload", COMMENT):
        assert raw not in page  # as markup, nowhere: title, findings, run sections, tables, inlined JSON
    findings = page[page.index("<section id='findings'>") :]
    # The stability finding's task labels, escaped (they ran as script before issue 32).
    assert (
        "&lt;img src=x onerror=window.__pwn=1&gt;–&lt;/script&gt;&lt;svg onload=window.__pwn=1&gt;"
        in findings
    )
    assert page.count("&lt;svg onload=window.__pwn=1&gt;") >= 3  # title, run name, task label, table cells
    for script in _inline_scripts(page):  # nothing that ends a script, opens a comment or ends a JS line
        assert "</script" not in script and "<!--" not in script
        assert "\u2028" not in script and "\u2029" not in script
    data = next(s for s in _inline_scripts(page) if s.startswith("var EXPLORER = "))
    tasks = json.loads(data[len("var EXPLORER = ") : -1])
    assert tasks[0]["samples"][0]["id"] == f"{COMMENT}{IMG}{SVG}{SEPARATORS}0-0"  # the data survive intact
    assert [t["name"] for t in tasks] == RUN_NAMES


def test_findings_of_flow_and_sap_runs_are_escaped(tmp_path):
    from corelens.report.summary import summary_section

    flow, sap = tmp_path / IMG.replace("/", ""), tmp_path / "sap"
    flow.mkdir(), sap.mkdir()
    pd.DataFrame({"row": [SVG], "rid": [0.5], "mixig": [0.25]}).to_csv(flow / "table1.csv", index=False)
    accuracy = {"condition": [IMG], "accuracy": [0.5], "ci_low": [0.4], "ci_high": [0.6]}
    pd.DataFrame(accuracy).to_csv(sap / "accuracy.csv", index=False)
    text = summary_section([flow, sap], [{"command": "flow", "samples": 1}, {"command": "sap", "samples": 1}])
    assert "<img" not in text and "<svg" not in text and "</script" not in text
    assert "&lt;/script&gt;&lt;svg onload=window.__pwn=1&gt;: RID 0.500" in text
    assert "&lt;img src=x onerror=window.__pwn=1&gt; 50 % [40–60 %]" in text


def test_the_policy_allows_only_the_pages_own_scripts_and_data_images(hostile):
    _, _, _, report = hostile
    page = report.read_text()
    policy = _policy(page)
    scripts = _inline_scripts(page)
    assert len(scripts) == 3  # figure count, explorer data, explorer code
    assert sorted(policy["script-src"]) == sorted(map(_sha256, scripts))
    style = re.search(r"<style>(.*?)</style>", page, flags=re.DOTALL).group(1)
    assert policy["style-src"] == [_sha256(style)]
    assert policy["default-src"] == ["'none'"] and policy["img-src"] == ["data:"]
    attributes = _attributes(page)  # no inline style or handler in the markup
    assert "style" not in attributes and not [a for a in attributes if a.startswith("on")], attributes
    assert page.index("Content-Security-Policy") < page.index("<style>") < page.index("<script>")


@pytest.mark.e2e  # a browser
@needs_chromium
def test_no_payload_runs_and_the_explorer_works_in_chromium(hostile, browser):  # noqa: F811
    _, runs, _, report = hostile
    browser.call("Page.navigate", url=report.as_uri())
    browser.wait(
        "document.body && document.body.dataset.explorer === 'ready' && !!document.body.dataset.figures"
    )
    assert browser.evaluate("typeof window.__pwn") == "undefined"
    assert browser.evaluate("document.title") == TITLE
    policy = browser.evaluate(
        "document.querySelector('meta[http-equiv=\"Content-Security-Policy\"]').content"
    )
    assert "script-src 'sha256-" in policy and "unsafe-inline" not in policy
    # A heatmap and an overlay per rank run, two stability figures: all decoded under the policy.
    assert browser.evaluate("document.body.dataset.figures") == "6/6"
    assert IMG in browser.evaluate("document.getElementById('findings').textContent")  # shown as text
    assert browser.evaluate(
        "Array.from(document.querySelectorAll('#tasks button')).map(b => b.textContent)"
    ) == (RUN_NAMES)
    picker = browser.evaluate(
        "Array.from(document.querySelectorAll('#sample-picker option')).map(o => o.text)"
    )
    assert picker == [f"{COMMENT}{IMG}{SVG}{SEPARATORS}0-{i}" for i in range(2)]  # the ids, intact
    best = pd.read_csv(runs[0] / "heads.csv").sort_values("rank").iloc[0]
    first = f"L{int(best.layer)}H{int(best['head'])}"
    browser.click(f'#grid td[data-head="{first}"]')
    browser.wait("document.querySelectorAll('#panel-a canvas[data-drawn]').length === 2")
    assert browser.evaluate("document.querySelector('#panel-a .head-label').textContent") == f"A: {first}"
    assert browser.evaluate("typeof window.__pwn") == "undefined"
    assert browser.errors() == []  # no script error and no policy violation
    assert [u for u in browser.requests() if not u.startswith(("file:", "data:"))] == []


@pytest.mark.e2e  # a browser
@needs_chromium
def test_the_policy_stops_markup_that_escaped_the_escaping(hostile, browser, tmp_path):  # noqa: F811
    """If a value ever reached the markup raw, the page's policy still runs none of it."""
    _, _, _, report = hostile
    page = report.read_text()
    injected = f'{IMG}<svg onload="window.__pwn=2"></svg><script>window.__pwn=3</script><a href="#" id="x" onclick="window.__pwn=4">x</a>'
    broken = tmp_path / "broken.html"
    broken.write_text(page.replace("<h1>", injected + "<h1>", 1))
    browser.call("Page.navigate", url=broken.as_uri())
    browser.wait("document.body && document.body.dataset.explorer === 'ready'")  # the page's own scripts run
    browser.click("#x")
    assert browser.evaluate("typeof window.__pwn") == "undefined"
    assert browser.errors() and all("Content Security Policy" in e for e in browser.errors())


# --- report --serve ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(hostile, tmp_path_factory):
    """Yield (server, port, folder) of the hostile study served as `report --serve` writes it.

    Beside the report lie a secret, a symlink to /etc/passwd and a folder: none may be served.
    """
    from corelens.commands.report import make_server
    from corelens.report.html import write_report_files

    _, runs, stable, _ = hostile
    folder = tmp_path_factory.mktemp("served")
    files = write_report_files([*runs, stable], folder / "report.html", title=TITLE, inline=False)
    assert [f.name for f in files] == ["report.html", "report.explorer.js"]
    (folder / "secret.txt").write_text("secret")
    (folder / "passwd").symlink_to("/etc/passwd")
    (folder / "sub").mkdir()
    (folder / "sub" / "secret.txt").write_text("secret")
    server = make_server(files, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, server.server_address[1], folder
    server.shutdown()
    server.server_close()


def _get(port: int, path: str, host: str | None = "", method: str = "GET", **headers) -> tuple[int, bytes]:
    """Send one raw request (the path as given, not normalised); `host` "" is 127.0.0.1:port, None none."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    if host is not None:
        conn.putheader("Host", host or f"127.0.0.1:{port}")
    for name, value in headers.items():
        conn.putheader(name.replace("_", "-"), value)
    conn.endheaders()
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, body


def test_serve_answers_the_report_and_its_explorer_data(served):
    _, port, folder = served
    assert _get(port, "/report.html") == (200, (folder / "report.html").read_bytes())
    assert _get(port, "/report.explorer.js") == (200, (folder / "report.explorer.js").read_bytes())
    assert _get(port, "/report.html?x=1#y")[0] == 200
    assert _get(port, "/report.html", host=f"localhost:{port}")[0] == 200
    assert _get(port, "/report.html", host=f"[::1]:{port}")[0] == 200
    assert _get(port, "/report.html", method="HEAD") == (200, b"")
    assert "'self'" in _policy((folder / "report.html").read_text())["script-src"]


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/secret.txt",
        "/passwd",
        "/sub/",
        "/sub/secret.txt",
        "/../secret.txt",
        "/..%2fsecret.txt",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/sub/../secret.txt",
        "/report.html/../secret.txt",
        "//etc/passwd",
        "/./report.html",
        "/report.html/",
        "/REPORT.HTML",
        "/.report.html",
        "report.html",
        "/report.html%00",
    ],
)
def test_serve_answers_404_to_everything_else(served, path):
    _, port, _ = served
    status, body = _get(port, path)
    assert status == 404 and b"secret" not in body and b"root:" not in body


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:{port}",
        "127.0.0.1",
        "127.0.0.1:1",
        "localhost.evil.example:{port}",
        None,
    ],
)
def test_serve_refuses_a_foreign_host(served, host):
    _, port, _ = served
    status, body = _get(port, "/report.html", host=None if host is None else host.format(port=port))
    assert 400 <= status < 500 and b"Content-Security-Policy" not in body


def test_serve_refuses_another_sites_page_and_other_methods(served):
    _, port, _ = served
    assert _get(port, "/report.explorer.js", Sec_Fetch_Site="cross-site")[0] == 403
    assert _get(port, "/report.explorer.js", Sec_Fetch_Site="same-origin")[0] == 200
    assert _get(port, "/report.html", method="POST")[0] == 501


def test_serve_refuses_to_start_on_a_symlink_or_a_file_outside_the_report_folder(tmp_path):
    from corelens.commands.report import make_server

    page = tmp_path / "report.html"
    page.write_text("<!DOCTYPE html>")
    link = tmp_path / "report.explorer.js"
    link.symlink_to("/etc/passwd")
    with pytest.raises(
        CorelensError, match=r"--serve refuses to serve .*report\.explorer\.js.*not a symlink"
    ):
        make_server([page, link], 0)
    (tmp_path / "other").mkdir()
    elsewhere = tmp_path / "other" / "data.js"
    elsewhere.write_text("var EXPLORER = [];")
    with pytest.raises(CorelensError, match="plain files of the report's own folder"):
        make_server([page, elsewhere], 0)
    with pytest.raises(CorelensError, match="not a symlink"):
        make_server([link], 0)


def test_the_report_replaces_a_planted_symlink_instead_of_writing_through_it(hostile, tmp_path):
    from corelens.report.html import write_report_files

    _, runs, _, _ = hostile
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / "r.html").symlink_to(victim)
    (tmp_path / "r.explorer.js").symlink_to(victim)
    files = write_report_files(runs[:1], tmp_path / "r.html", inline=False)
    assert victim.read_text() == "keep me"
    assert not any(f.is_symlink() for f in files) and files[0].read_text().startswith("<!DOCTYPE html>")


def test_the_page_is_readable_by_others_and_scales_on_a_phone(hostile, tmp_path):
    """0644 (less the umask) like every file a run writes, so a colleague on a shared server can open it; a
    viewport meta, so a phone does not draw it at desktop width (issue 44)."""
    from corelens.report.html import write_report_files

    _, runs, _, _ = hostile
    old = os.umask(0o022)
    try:
        files = write_report_files(runs[:1], tmp_path / "r.html", inline=False)
    finally:
        os.umask(old)
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o644 for f in files), [oct(f.stat().st_mode) for f in files]
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in files[0].read_text()


@pytest.mark.e2e  # a browser
@needs_chromium
def test_the_served_report_runs_no_payload_in_chromium(served, browser):  # noqa: F811
    _, port, _ = served
    browser.call("Page.navigate", url=f"http://127.0.0.1:{port}/report.html")
    browser.wait("document.body && document.body.dataset.explorer === 'ready'")
    assert browser.evaluate("typeof window.__pwn") == "undefined"
    assert browser.evaluate("document.querySelectorAll('#grid td.cell').length") == 8
    assert browser.errors() == []


def test_port_out_of_range_is_one_line_at_parse_time(hostile, tmp_path, capsys):
    _, runs, _, _ = hostile
    out = tmp_path / "r.html"
    assert main(["report", str(runs[0]), "--out", str(out), "--serve", "--port", "70000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("argument --port: must be 0 (any free port) to 65535, got 70000")
    assert all(line.startswith(("usage:", " ")) for line in err[:-1]) and not out.exists()
    assert main(["report", str(runs[0]), "--out", str(out), "--port", "http"]) == 2
    assert "expected a port number, got 'http'" in capsys.readouterr().err
