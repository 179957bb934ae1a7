"""The tune's figure: a PNG, and a page that stands alone (no script, no link, no reference),
whose SVG names every run, today's settings and the recommendation, above a table of the
runs with everything escaped; a run where nothing answered is drawn, not a crash."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sluicegate.tuning.objective import Objective, Score
from sluicegate.tuning.outputs import Row
from sluicegate.tuning.plot import pareto_front, write_pareto
from sluicegate.tuning.search import Config

TODAY = Config()
BEST = Config.of({"max_num_seqs": 32})
ODD = Config.of({"scheduling_policy": "<script>&"})
"""A label that must be escaped."""
OBJECTIVE = Objective(ttft=2.0, itl=0.1)
TITLE = "sluicegate tune: <chat> & more"


def _score(goodput: float, ttft: float, itl: float) -> Score:
    attainment = min(1.0, goodput / 4)
    return Score(
        goodput, attainment, ttft / 2, ttft, ttft * 1.5, itl, goodput * 70, 0, 0,
        round(attainment * 40), 40,
    )  # fmt: skip


ROWS = [
    Row("search", 0, 0, "trial", TODAY, 20.0, 40, _score(1.5, 2.6, 0.14)),
    Row("search", 0, 0, "trial", BEST, 20.0, 40, _score(3.9, 0.8, 0.06)),
    Row("search", 0, 0, "trial", ODD, 20.0, 40, _score(3.0, 0.5, 0.08)),
    Row(
        "search", 0, 0, "trial", Config.of({"max_num_seqs": 512}), 20.0, 40,
        Score(0.0, 0.0, math.inf, math.inf, math.inf, 0.0, 0.0, 0, 40, 0, 40),
    ),
    Row("search", 1, 0, "trial", BEST, 40.0, 80, _score(4.1, 0.9, 0.06)),
    Row("search", 1, 0, "trial", ODD, 40.0, 80, _score(2.9, 0.6, 0.08)),
    Row("confirm", -1, 0, "today", TODAY, 60.0, 120, _score(1.4, 2.8, 0.14)),
    Row("confirm", -1, 0, "candidate", BEST, 60.0, 120, _score(4.0, 0.85, 0.05)),
]  # fmt: skip


@pytest.fixture(scope="module")
def drawn(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, bytes]:
    folder = tmp_path_factory.mktemp("pareto")
    write_pareto(folder / "p.html", folder / "p.png", ROWS, OBJECTIVE, TODAY, BEST, TITLE)
    return (folder / "p.html").read_text(encoding="utf-8"), (folder / "p.png").read_bytes()


def test_the_png_is_a_png_of_a_figure(drawn: tuple[str, bytes]) -> None:
    _, png = drawn
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(png) > 20_000


def test_the_page_fetches_nothing(drawn: tuple[str, bytes]) -> None:
    page = drawn[0].lower()
    assert "<svg" in page
    for reference in ("<script", "src=", "href=", "url(http", "@import", "<link", "<iframe"):
        assert reference not in page, reference


def test_the_svg_names_every_run_today_and_the_recommendation(drawn: tuple[str, bytes]) -> None:
    ids = re.findall(r'\bid="([^"]+)"', drawn[0])
    assert len(ids) == len(set(ids)), "an id given twice"
    names = set(ids)
    search = [f"trial-{n}" for n, row in enumerate(ROWS, 1) if row.stage == "search"]
    confirm = [f"confirm-{n}" for n, row in enumerate(ROWS, 1) if row.stage == "confirm"]
    for suffix in ("", "-itl"):
        assert {f"{name}{suffix}" for name in [*search, *confirm]} <= names
        assert {f"today{suffix}", f"recommended{suffix}"} <= names
    assert "pareto-front" in names


def test_each_point_has_a_tooltip_naming_its_run(drawn: tuple[str, bytes]) -> None:
    point = re.search(r'<g id="trial-5"[^>]*>\s*<title>([^<]*)</title>', drawn[0])
    assert point is not None
    assert point.group(1).startswith("#5 max_num_seqs=32 (window 1): goodput 4.10/s")
    silent = re.search(r'<g id="trial-4"[^>]*>\s*<title>([^<]*)</title>', drawn[0])
    assert silent is not None and "P90 TTFT none, P90 ITL none" in silent.group(1)


def test_the_table_holds_a_row_per_run_escaped(drawn: tuple[str, bytes]) -> None:
    page = drawn[0]
    body = page[page.index("<tbody>") : page.index("</tbody>")]
    assert body.count("<tr>") == len(ROWS)
    assert "scheduling_policy=&lt;script&gt;&amp;" in body
    assert "<title>sluicegate tune: &lt;chat&gt; &amp; more</title>" in page
    assert "<chat>" not in page


def test_without_a_recommendation_no_diamond_is_drawn(tmp_path: Path) -> None:
    html, png = tmp_path / "p.html", tmp_path / "p.png"
    write_pareto(html, png, ROWS, OBJECTIVE, TODAY, None, "no recommendation")
    ids = set(re.findall(r'\bid="([^"]+)"', html.read_text(encoding="utf-8")))
    assert "today" in ids and "recommended" not in ids
    assert png.stat().st_size > 20_000


def test_importing_the_module_loads_no_matplotlib() -> None:
    script = "import sys\nimport sluicegate.tuning.plot\nprint('matplotlib' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_the_pareto_front_keeps_what_nothing_beats_on_both_axes() -> None:
    points = [(2.0, 3.0), (0.5, 1.0), (1.0, 2.5), (1.0, 2.0), (1.5, 2.4), (3.0, 3.0), (0.5, 0.5)]
    assert pareto_front(points) == [(0.5, 1.0), (1.0, 2.5), (2.0, 3.0)]
    assert pareto_front([]) == []
