"""mlrepro.scoring.report: the HTML page renders with its plots in headless Chromium."""

from __future__ import annotations

import shutil
import subprocess

import pytest

import logs_factory as lf
from mlrepro.scoring import score as scoring
from mlrepro.scoring.rules import rules_for
from mlrepro.scoring.report import write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def make_score(tmp_path):
    specs = lf.ten_runs()
    specs[4] = dict(specs[4], converge=False)
    paths = lf.write_runs(tmp_path / "runs", specs)
    return scoring.score_runs(paths, rules_for("llama2_70b_lora")), paths


def test_report_content(tmp_path):
    score, paths = make_score(tmp_path)
    out = write_report(score, {100 + i: p for i, p in enumerate(paths)}, tmp_path / "report.html")
    page = out.read_text()
    assert page.count("<svg") == 2 and "<img" not in page and "src=\"http" not in page
    assert f"{score['score_minutes']:.3f}" in page and "VALID" in page
    assert page.count("<tr><td>") == 10 and "aborted" in page
    assert "target &lt;= 0.925" in page and "seed 109" in page  # legend of the convergence plot
    # without logs the evaluations stored in the runs are used
    page2 = write_report(score, None, tmp_path / "r2.html").read_text()
    assert page2.count("<svg") == 2 and "seed 109" in page2


def chromium(*args, tmp_path):
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
            f"--user-data-dir={tmp_path / 'profile'}"]
    return subprocess.run(base + list(args), capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_report_renders_in_headless_chromium(tmp_path):
    score, paths = make_score(tmp_path)
    out = write_report(score, paths, tmp_path / "report.html")
    dom = chromium("--dump-dom", out.as_uri(), tmp_path=tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count("<svg") == 2 and "id=\"eval-plot\"" in dom.stdout and "id=\"time-plot\"" in dom.stdout
    png = tmp_path / "shot.png"
    shot = chromium(f"--screenshot={png}", "--window-size=1200,2400", "--hide-scrollbars", out.as_uri(),
                    tmp_path=tmp_path)
    assert shot.returncode == 0 and png.exists(), shot.stderr[-2000:]
    from matplotlib import image

    pixels = image.imread(png)[..., :3]
    # a blank page is one colour; plots and tables give many
    colours = {tuple(p) for p in (pixels.reshape(-1, 3)[::97] * 255).astype(int)}
    assert len(colours) > 20
    # the plots area (below the run table) is not blank either
    assert pixels[900:2300].std() > 0.05
