"""Server-side SVG charts for the admin's queue dashboard: no JavaScript, no files to serve.

Each function returns markup to put inline in the page, so the admin's own CSS variables colour
the text and the grid (light and dark themes alike) and the series take their colour from the
classes ``dbq-s0`` ... that the dashboard template defines for both themes. Every chart has a
``<title>`` and a ``<desc>`` naming its latest values, for screen readers, and an HTML legend.
"""

import math

from django.utils.html import escape
from django.utils.safestring import mark_safe

WIDTH, HEIGHT = 640, 200
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 24, 26
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM


def nice_ceiling(value):
    """The smallest of 1, 2, 2.5, 5 x 10^k at or above ``value`` (1 for 0 or less)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for factor in (1, 2, 2.5, 5, 10):
        if value <= factor * power * (1 + 1e-9):
            return factor * power
    return 10 * power  # not reached


def number(value):
    """A short axis or legend label: 0.25, 12, 1.5k, 3M."""
    if value is None:
        return "-"
    size = abs(value)
    if size >= 1e6:
        return f"{value / 1e6:.3g}M"
    if size >= 1e3:
        return f"{value / 1e3:.3g}k"
    if size >= 10 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.2g}"


def _frame(chart_id, title, desc, y_max, unit, x_labels):
    """The opening tag, title, description, grid, y labels and x labels."""
    parts = [
        f'<svg class="dbq-chart" id="{chart_id}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-labelledby="{chart_id}-title {chart_id}-desc" preserveAspectRatio="xMidYMid meet">',
        f'<title id="{chart_id}-title">{escape(title)}</title>',
        f'<desc id="{chart_id}-desc">{escape(desc)}</desc>',
    ]
    for i in range(5):
        value = y_max * i / 4
        y = TOP + PLOT_H - PLOT_H * i / 4
        parts.append(
            f'<line class="dbq-grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
        )
        parts.append(
            f'<text class="dbq-axis" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{escape(number(value))}</text>"
        )
    parts.append(f'<text class="dbq-axis" x="4" y="12" text-anchor="start">{escape(unit)}</text>')
    for x, label in x_labels:
        parts.append(
            f'<text class="dbq-axis" x="{x:.1f}" y="{HEIGHT - 8}" text-anchor="middle">'
            f"{escape(label)}</text>"
        )
    return parts


def _x(index, count):
    return LEFT + PLOT_W * (index + 0.5) / count


def _x_labels(labels, count, every):
    return [(_x(i, count), labels[i]) for i in range(0, count, every)]


def _legend(names):
    items = "".join(
        f'<li><span class="dbq-swatch dbq-s{i}" aria-hidden="true"></span>{escape(name)}</li>'
        for i, name in enumerate(names)
    )
    return f'<ul class="dbq-legend">{items}</ul>'


def stacked_bars(chart_id, title, series, labels, *, unit, every=12):
    """Bars stacked per bucket. ``series``: ``[(name, [value per bucket]), ...]``."""
    count = len(labels)
    totals = [sum(values[i] for _, values in series) for i in range(count)]
    y_max = nice_ceiling(max(totals, default=0))
    latest = ", ".join(f"{name} {number(values[-1])}" for name, values in series)
    desc = f"{count} bars, latest: {latest} ({unit}); highest total {number(max(totals))}."
    parts = _frame(chart_id, title, desc, y_max, unit, _x_labels(labels, count, every))
    bar = PLOT_W / count * 0.8
    for i in range(count):
        base = TOP + PLOT_H
        for s, (name, values) in enumerate(series):
            height = PLOT_H * values[i] / y_max
            if height <= 0:
                continue
            base -= height
            parts.append(
                f'<rect class="dbq-s{s}" x="{_x(i, count) - bar / 2:.1f}" y="{base:.1f}" '
                f'width="{bar:.1f}" height="{height:.1f}"><title>{escape(labels[i])} '
                f"{escape(name)}: {escape(number(values[i]))}</title></rect>"
            )
    parts.append("</svg>")
    return mark_safe("".join(parts) + _legend([name for name, _ in series]))  # noqa: S308 (escaped)


def lines(chart_id, title, series, labels, *, unit, every=12):
    """One line per series; ``None`` values leave a gap. Points are drawn, so that a series of
    one sample still shows."""
    count = len(labels)
    values = [v for _, vs in series for v in vs if v is not None]
    y_max = nice_ceiling(max(values, default=0))
    latest = ", ".join(
        f"{name} {number(next((v for v in reversed(vs) if v is not None), None))}"
        for name, vs in series
    )
    desc = f"{count} points, latest: {latest} ({unit})."
    parts = _frame(chart_id, title, desc, y_max, unit, _x_labels(labels, count, every))
    for s, (name, vs) in enumerate(series):
        path, pen_down = [], False
        for i, value in enumerate(vs):
            if value is None:
                pen_down = False
                continue
            y = TOP + PLOT_H - PLOT_H * value / y_max
            path.append(f"{'L' if pen_down else 'M'}{_x(i, count):.1f},{y:.1f}")
            pen_down = True
            parts.append(
                f'<circle class="dbq-s{s}" cx="{_x(i, count):.1f}" cy="{y:.1f}" r="2">'
                f"<title>{escape(labels[i])} {escape(name)}: {escape(number(value))}</title>"
                "</circle>"
            )
        if path:
            parts.append(f'<path class="dbq-line dbq-s{s}" d="{" ".join(path)}"/>')
    parts.append("</svg>")
    return mark_safe("".join(parts) + _legend([name for name, _ in series]))  # noqa: S308 (escaped)


def horizontal_bars(chart_id, title, rows, *, names, unit):
    """One row per label, its values side by side: ``rows`` is ``[(label, [v, ...]), ...]``."""
    height = TOP + BOTTOM + 22 * max(len(rows), 1)
    y_max = nice_ceiling(max((sum(vs) for _, vs in rows), default=0))
    left = 200
    plot = WIDTH - left - RIGHT
    desc = "; ".join(
        f"{label}: " + ", ".join(f"{n} {number(v)}" for n, v in zip(names, vs, strict=True))
        for label, vs in rows
    )
    parts = [
        f'<svg class="dbq-chart" id="{chart_id}" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-labelledby="{chart_id}-title {chart_id}-desc">',
        f'<title id="{chart_id}-title">{escape(title)}</title>',
        f'<desc id="{chart_id}-desc">{escape(desc or "none")}</desc>',
    ]
    if not rows:
        parts.append(
            f'<text class="dbq-axis" x="{WIDTH / 2}" y="{height / 2}" text-anchor="middle">'
            "No failures in this window.</text>"
        )
    for r, (label, vs) in enumerate(rows):
        y = TOP + 22 * r
        shown = label if len(label) <= 30 else label[:29] + "…"
        parts.append(
            f'<text class="dbq-axis" x="{left - 6}" y="{y + 15}" text-anchor="end">'
            f"<title>{escape(label)}</title>{escape(shown)}</text>"
        )
        x = left
        for s, value in enumerate(vs):
            width = plot * value / y_max
            if width > 0:
                parts.append(
                    f'<rect class="dbq-s{s}" x="{x:.1f}" y="{y + 3}" width="{width:.1f}" '
                    f'height="16"><title>{escape(label)} {escape(names[s])}: {value}</title>'
                    "</rect>"
                )
            x += width
        parts.append(
            f'<text class="dbq-axis" x="{x + 4:.1f}" y="{y + 15}">{escape(number(sum(vs)))}</text>'
        )
    parts.append(
        f'<text class="dbq-axis" x="{WIDTH - RIGHT}" y="{height - 8}" text-anchor="end">'
        f"{escape(unit)}</text></svg>"
    )
    return mark_safe("".join(parts) + _legend(names))  # noqa: S308 (escaped)
