"""The tune's figure: goodput against P90 TTFT and throughput against P90 ITL, every run a
point, as a PNG and as a page that stands alone (`pareto.html`).

One matplotlib `Figure` drawn on its own Agg canvas: nothing of pyplot, no backend chosen for
the process. matplotlib is imported when a figure is drawn, so the other commands do not pay
for it. The page holds the figure as inline SVG with every `<use>` expanded in place: no
script, no link, nothing to fetch (its only references are to its own clip paths), and the
points carry ids (`today`, `recommended`,
`trial-N`, `confirm-N`, N the row of the table below it; `-itl` on the second panel) and a
tooltip. Drawing is CPU work: async callers hand it to a thread.
"""

from __future__ import annotations

import copy
import html
import io
import math
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sluicegate.tuning.objective import Objective, Score
from sluicegate.tuning.outputs import Row, latency_text, seconds_text
from sluicegate.tuning.search import Config

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.lines import Line2D

PNG_DPI = 110
_SVG = "http://www.w3.org/2000/svg"
_XLINK = "http://www.w3.org/1999/xlink"
_LOG_SPREAD = 20.0
"""A TTFT axis whose values span more than this factor is drawn in log scale: an overloaded
configuration's seconds would otherwise squeeze the others against the axis."""


@dataclass(frozen=True, slots=True)
class _Panel:
    x: str
    y: str
    """The `Score` fields drawn."""
    xlabel: str
    ylabel: str
    target: float
    target_name: str
    suffix: str
    """Appended to the ids of the second panel's points, so that ids stay unique."""
    front: bool
    """Whether the Pareto front is drawn; its time axis turns logarithmic when wide."""

    def x_of(self, score: Score) -> float:
        return float(getattr(score, self.x))

    def y_of(self, score: Score) -> float:
        return float(getattr(score, self.y))

    @property
    def target_label(self) -> str:
        return f"{self.target_name} target {seconds_text(self.target)}"


@dataclass(frozen=True, slots=True)
class _Mark:
    gid: str
    label: str
    marker: str
    size: float
    color: str
    rows: tuple[Row, ...]


def write_pareto(
    html_path: Path,
    png_path: Path,
    rows: Sequence[Row],
    objective: Objective,
    today: Config,
    recommended: Config | None,
    title: str,
) -> None:
    """The figure of `rows` as a PNG at `png_path` and, with a table of the rows, as a
    self-contained page at `html_path`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = _panels(objective)
    figure = Figure(figsize=(12, 5.2), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, 2)
    marks = _marks(rows, today, recommended)
    style = _Style.of(rows)
    for ax, panel in zip(axes, panels, strict=True):
        _draw(ax, panel, rows, marks, style)
    figure.suptitle(title)
    handles = _legend(rows, marks, style)
    figure.legend(handles=handles, loc="outside lower center", ncol=4, fontsize="small")
    figure.savefig(png_path, format="png", dpi=PNG_DPI)
    svg = io.BytesIO()
    figure.savefig(svg, format="svg")
    tips = _tooltips(rows, panels, marks)
    page = _page(title, _standalone_svg(svg.getvalue(), tips), rows)
    html_path.write_text(page, encoding="utf-8")


def _panels(objective: Objective) -> tuple[_Panel, _Panel]:
    ttft = ("P90 time to first token (s)", "goodput (requests/s meeting the objective)")
    itl = ("P90 inter-token latency (s, median request)", "throughput (output tokens/s)")
    return (
        _Panel("ttft_p90", "goodput", *ttft, objective.ttft, "TTFT", "", front=True),
        _Panel("itl_p90", "throughput", *itl, objective.itl, "ITL", "-itl", front=False),
    )


def _marks(rows: Sequence[Row], today: Config, recommended: Config | None) -> list[_Mark]:
    """Today's settings and the recommendation where they ran longest in the search, or, if
    they were not searched, as the mean of their confirmation runs."""
    marks = [_Mark("today", "today's settings", "*", 17, "gold", _runs_of(rows, today, "today"))]
    if recommended is not None:
        runs = _runs_of(rows, recommended, "candidate")
        marks.append(_Mark("recommended", "recommended", "D", 10, "crimson", runs))
    return [mark for mark in marks if mark.rows]


def _runs_of(rows: Sequence[Row], config: Config, arm: str) -> tuple[Row, ...]:
    searched = [r for r in rows if r.stage == "search" and r.config == config]
    if searched:
        longest = max(r.rung for r in searched)
        return tuple(r for r in searched if r.rung == longest)
    return tuple(r for r in rows if r.stage == "confirm" and r.arm == arm)


@dataclass(frozen=True, slots=True)
class _Style:
    """How runs are told apart, the same on both panels and in the legend: a search's rungs
    by shade and size, the confirmation's arms by colour, as squares."""

    rungs: tuple[int, ...]
    windows: dict[int, float]
    colors: dict[int, tuple[float, float, float, float]]

    @classmethod
    def of(cls, rows: Sequence[Row]) -> _Style:
        from matplotlib import colormaps

        windows = {r.rung: r.window_seconds for r in rows if r.stage == "search"}
        rungs = tuple(sorted(windows))
        shade = colormaps["viridis"]
        last = max(1, len(rungs) - 1)
        return cls(rungs, windows, {rung: shade(0.85 * i / last) for i, rung in enumerate(rungs)})

    def size(self, rung: int) -> float:
        return 5 + 2 * self.rungs.index(rung)


_ARM_COLORS = {"today": "dimgray", "candidate": "darkorange"}
_TARGET_COLOR = "firebrick"
_FRONT_COLOR = "steelblue"


def _draw(
    ax: Axes, panel: _Panel, rows: Sequence[Row], marks: Sequence[_Mark], style: _Style
) -> None:
    finite = [panel.x_of(r.score) for r in rows if _answered(r, panel)]
    log = panel.front and bool(finite) and 0 < _LOG_SPREAD * min(finite) < max(finite)
    # Where a run that never answered is drawn, hollow.
    edge = max([*finite, panel.target]) * (1.6 if log else 1.1)
    for number, row in enumerate(rows, start=1):
        answered = _answered(row, panel)
        searched = row.stage == "search"
        color = style.colors[row.rung] if searched else _ARM_COLORS[row.arm]
        ax.plot(
            [panel.x_of(row.score) if answered else edge],
            [panel.y_of(row.score)],
            linestyle="",
            marker="o" if searched else "s",
            markersize=style.size(row.rung) if searched else 7,
            color=color,
            markerfacecolor=color if answered else "none",
            alpha=0.85,
            gid=f"{'trial' if searched else 'confirm'}-{number}{panel.suffix}",
        )
    for mark in marks:
        ax.plot(
            *_mean_point(mark.rows, panel, edge),
            linestyle="",
            marker=mark.marker,
            markersize=mark.size,
            markerfacecolor=mark.color,
            markeredgecolor="black",
            zorder=5,
            gid=f"{mark.gid}{panel.suffix}",
        )
    ax.axvline(panel.target, linestyle="--", color=_TARGET_COLOR, linewidth=1.2)
    ax.text(
        panel.target, 0.01, f" {panel.target_label}", transform=ax.get_xaxis_transform(),
        ha="left", va="bottom", fontsize="small", color=_TARGET_COLOR,
    )  # fmt: skip
    if panel.front:
        _draw_front(ax, panel, [r for r in rows if r.stage == "search"], edge)
    if log:
        ax.set_xscale("log")
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    ax.grid(True, alpha=0.3)


def _draw_front(ax: Axes, panel: _Panel, rows: Sequence[Row], edge: float) -> None:
    front = pareto_front(
        (panel.x_of(r.score), panel.y_of(r.score)) for r in rows if _answered(r, panel)
    )
    if front:
        # Held to the edge: the most to be had within each time.
        xs, ys = [*(x for x, _ in front), edge], [*(y for _, y in front), front[-1][1]]
        ax.step(xs, ys, where="post", color=_FRONT_COLOR, linewidth=1.2, gid="pareto-front")


def _legend(rows: Sequence[Row], marks: Sequence[_Mark], style: _Style) -> list[Line2D]:
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], linestyle="", marker="o", markersize=style.size(rung),
               color=style.colors[rung],
               label=f"search, window {rung} ({style.windows[rung]:.0f} s)")
        for rung in style.rungs
    ]  # fmt: skip
    handles += [
        Line2D([], [], linestyle="", marker="s", markersize=7, color=color,
               label=f"confirmation, {arm}")
        for arm, color in _ARM_COLORS.items()
        if any(r.stage == "confirm" and r.arm == arm for r in rows)
    ]  # fmt: skip
    handles += [
        Line2D([], [], linestyle="", marker=m.marker, markersize=m.size * 0.7,
               markerfacecolor=m.color, markeredgecolor="black", label=m.label)
        for m in marks
    ]  # fmt: skip
    return [
        *handles,
        Line2D([], [], linestyle="", marker="o", color="gray", markerfacecolor="none",
               label="hollow: nothing answered (drawn at the edge)"),
        Line2D([], [], linestyle="--", color=_TARGET_COLOR, label="the objective's target"),
        Line2D([], [], color=_FRONT_COLOR, label="Pareto front (search)"),
    ]  # fmt: skip


def _answered(row: Row, panel: _Panel) -> bool:
    """Whether the run has a time to show: one where nothing answered has an infinite TTFT
    and, on the ITL panel, a gap of 0 that means nothing."""
    return math.isfinite(row.score.ttft_p90) and math.isfinite(panel.x_of(row.score))


def _mean_point(rows: Sequence[Row], panel: _Panel, edge: float) -> tuple[list[float], ...]:
    answered = all(_answered(r, panel) for r in rows)
    x = sum(panel.x_of(r.score) for r in rows) / len(rows) if answered else edge
    return [x], [sum(panel.y_of(r.score) for r in rows) / len(rows)]


def pareto_front(points: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The `(time, value)` points no other beats on both (a shorter time and a larger
    value), in order of time."""
    front: list[tuple[float, float]] = []
    for x, y in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or y > front[-1][1]:
            front.append((x, y))
    return front


def _tooltips(
    rows: Sequence[Row], panels: Sequence[_Panel], marks: Sequence[_Mark]
) -> dict[str, str]:
    tips = {}
    for panel in panels:
        for number, row in enumerate(rows, start=1):
            kind = "trial" if row.stage == "search" else "confirm"
            tips[f"{kind}-{number}{panel.suffix}"] = f"#{number} {_describe(row)}"
        for mark in marks:
            tips[f"{mark.gid}{panel.suffix}"] = mark.label
    return tips


def _describe(row: Row) -> str:
    where = f"window {row.rung}" if row.stage == "search" else f"pair {row.round}, {row.arm}"
    ttft, itl = latency_text(row.score)
    return (
        f"{row.config.label()} ({where}): goodput {row.score.goodput:.2f}/s, "
        f"P90 TTFT {ttft}, P90 ITL {itl}, {row.score.throughput:.0f} tok/s"
    )


def _standalone_svg(svg: bytes, tooltips: dict[str, str]) -> str:
    """matplotlib's SVG as a page's inline element: each `<use>` replaced by a copy of what
    it pointed to, the definitions and metadata dropped, a `<title>` in each point."""
    root = ET.fromstring(svg)
    by_id = {e.get("id"): e for e in root.iter() if e.get("id")}
    parents = {child: parent for parent in root.iter() for child in parent}
    used: set[ET.Element] = set()
    for use in [e for e in root.iter(f"{{{_SVG}}}use")]:
        ref = (use.get(f"{{{_XLINK}}}href") or use.get("href") or "").removeprefix("#")
        target = by_id[ref]
        used.add(target)
        moved = f"translate({use.get('x', '0')} {use.get('y', '0')})"
        attributes = {
            k: v for k, v in use.attrib.items() if k not in ("x", "y") and "href" not in k
        }
        attributes["transform"] = f"{attributes.get('transform', '')} {moved}".strip()
        group = ET.Element(f"{{{_SVG}}}g", attributes)
        inlined = copy.deepcopy(target)
        for element in inlined.iter():
            element.attrib.pop("id", None)
        group.append(inlined)
        parent = parents[use]
        parent[list(parent).index(use)] = group
    for target in used:
        parents[target].remove(target)
    for element in [*root.iter(f"{{{_SVG}}}defs"), *root.iter(f"{{{_SVG}}}metadata")]:
        if element.tag.endswith("metadata") or len(element) == 0:
            parents[element].remove(element)
    for gid, tip in tooltips.items():
        point = by_id.get(gid)
        if point is not None:
            title = ET.Element(f"{{{_SVG}}}title")
            title.text = tip
            point.insert(0, title)
    for element in root.iter():
        element.tag = element.tag.removeprefix(f"{{{_SVG}}}")
    root.set("xmlns", _SVG)
    return ET.tostring(root, encoding="unicode")


_COLUMNS = (
    "#", "stage", "window", "pair", "arm", "configuration", "offered s", "requests",
    "goodput /s", "attainment", "P90 TTFT", "P90 ITL", "tokens/s", "refused", "failed",
)  # fmt: skip
_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222}"
    "svg{max-width:100%;height:auto}"
    "table{border-collapse:collapse;font-size:0.85rem}"
    "th,td{border:1px solid #ccc;padding:0.15rem 0.5rem;text-align:right}"
    "td:nth-child(-n+6){text-align:left}"
)


def _page(title: str, svg: str, rows: Sequence[Row]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in _COLUMNS)
    body = "\n".join(_table_row(number, row) for number, row in enumerate(rows, start=1))
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
        f"<h1>{html.escape(title)}</h1>\n<figure>\n{svg}\n</figure>\n"
        f"<h2>Runs</h2>\n<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n"
        "</table>\n</body>\n</html>\n"
    )


def _table_row(number: int, row: Row) -> str:
    score = row.score
    cells = (
        str(number),
        row.stage,
        str(row.rung) if row.stage == "search" else "",
        str(row.round) if row.stage == "confirm" else "",
        row.arm,
        row.config.label(),
        f"{row.window_seconds:.0f}",
        str(row.requests),
        f"{score.goodput:.2f}",
        f"{score.attainment:.0%}",
        *latency_text(score),
        f"{score.throughput:.0f}",
        str(score.refused),
        str(score.failed) + (" (stopped early)" if row.stopped_early else ""),
    )
    return "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"
