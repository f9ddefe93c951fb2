"""Draw a `Timeline` as inline SVG, on the server: no script, no library, readable at a glance.

One lane per step; one bar per attempt on a shared time axis, coloured by outcome AND marked
with a glyph and words (the summary column, the legend, the hover titles), so nothing depends
on colour alone. Back-off waits are dashed lines, crash gaps hatched boxes, events small
shapes above the bars; a timer, signal or approval the step waited for is a pale bar from the
wait's start to its end, labelled with what it waited for and how that ended. Every element
carries a `<title>` with its times for the hover text.
Text uses `currentColor`, so the picture follows the admin's light or dark theme.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from agentflow.admin.timeline import Attempt, Interval, Lane, Mark, MarkKind, Outcome, Timeline
from agentflow.admin.timeline import seconds_text as span_text
from agentflow.admin.timeline_waits import WaitEnd, WaitSpan

WIDTH = 960
LABEL_W = 190
SUMMARY_W = 170
X0 = LABEL_W + 8
X1 = WIDTH - SUMMARY_W - 12
AXIS_H = 38
LANE_H = 34
BAR_Y, BAR_H = 9, 14  # inside a lane: event marks above the bar, attempt numbers below
#: The narrowest bar drawn: an attempt of a read step takes a millisecond.
MIN_BAR_W = 3.0
#: Attempt numbers are written under bars at least this far apart.
NUMBER_SPACING = 11.0
CHAR_W = 6.1  # average width of an 11 px system-ui character, for layout only
NAME_CHARS = 27
TICKS_AT_MOST = 8
TICK_STEPS = (
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1,
    2,
    5,
    10,
    15,
    30,
    60,
    120,
    300,
    600,
    900,
    1800,
    3600,
    7200,
    14400,
    21600,
    43200,
    86400,
    172800,
    604800,
)

OUTCOME_STYLE: dict[Outcome, tuple[str, str, str]] = {
    # outcome: (fill, glyph, words)
    Outcome.COMPLETED: ("#16a34a", "✓", "completed"),
    Outcome.RETRIED: ("#d97706", "↻", "failed, retried"),
    Outcome.FAILED: ("#dc2626", "✕", "failed"),
    Outcome.LOST: ("#991b1b", "✕", "worker lost (its claim)"),
    Outcome.RUNNING: ("#2563eb", "▶", "running"),
    Outcome.INTERRUPTED: ("#64748b", "■", "interrupted"),
    Outcome.SUPERSEDED: ("#94a3b8", "↶", "superseded by a fork"),
}
MARK_STYLE: dict[MarkKind, tuple[str, str]] = {
    MarkKind.SWEEP: ("#7c3aed", "sweeper re-published"),
    MarkKind.OPERATOR: ("#0d9488", "operator action"),
    MarkKind.PARKED: ("#ea580c", "parked / outcome unknown"),
    MarkKind.RECONCILED: ("#0891b2", "reconciled with partner"),
    MarkKind.LATE: ("#64748b", "late completion fenced out"),
    MarkKind.COMPENSATION: ("#be185d", "compensation started"),
    MarkKind.DIVERGED: ("#c026d3", "diverged from its history"),
    MarkKind.FORK: ("#0f766e", "forked by an operator"),
}
WAIT_COLOUR = "#d97706"
#: A timer's, a signal's and an approval's wait bar: (colour, legend words).
WAIT_BAR_STYLE: dict[str, tuple[str, str]] = {
    "timer": ("#0284c7", "waited for a timer"),
    "signal": ("#9333ea", "waited for a signal"),
    "approval": ("#ca8a04", "waited for approval"),
}
WAIT_LABEL_SIZE = 9.5
DEFS = (
    "<defs>"
    '<pattern id="af-tl-hatch-red" width="6" height="6" patternUnits="userSpaceOnUse" '
    'patternTransform="rotate(45)"><rect width="6" height="6" fill="#dc2626" fill-opacity=".12"/>'
    '<line x1="0" y1="0" x2="0" y2="6" stroke="#dc2626" stroke-width="2.5"/></pattern>'
    '<pattern id="af-tl-hatch-grey" width="6" height="6" patternUnits="userSpaceOnUse" '
    'patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" stroke="#94a3b8" '
    'stroke-width="2"/></pattern>'
    "</defs>"
)


@dataclass(frozen=True)
class Scale:
    start: datetime
    seconds: float

    def x(self, at: datetime) -> float:
        offset = (at - self.start).total_seconds() / self.seconds
        return X0 + min(max(offset, 0.0), 1.0) * (X1 - X0)


def render(timeline: Timeline) -> SafeString:
    """The whole picture as one `<svg>` element, safe to put in a template as it is."""
    scale = Scale(timeline.start, max((timeline.end - timeline.start).total_seconds(), 0.001))
    rows: list[tuple[str, Lane | None]] = []
    if timeline.run_marks:
        rows.append(("run", None))
    rows += [(f"#{lane.seq}", lane) for lane in timeline.lanes]
    body_h = AXIS_H + LANE_H * max(len(rows), 1)
    legend, legend_h = _legend(timeline, top=body_h + 14)
    height = body_h + 14 + legend_h
    parts = [
        f'<svg class="af-timeline-svg" xmlns="http://www.w3.org/2000/svg" '
        f'viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" '
        f'aria-labelledby="af-tl-title af-tl-desc" font-family="system-ui, sans-serif" '
        f'font-size="11" fill="currentColor">',
        f'<title id="af-tl-title">Timeline of run {escape(timeline.run_id)}</title>',
        f'<desc id="af-tl-desc">{escape(describe(timeline))}</desc>',
        DEFS,
    ]
    parts += _axis(timeline, scale, body_h)
    for index, (_, lane) in enumerate(rows):
        top = AXIS_H + index * LANE_H
        if index % 2 == 0:
            parts.append(
                f'<rect class="af-tl-stripe" x="0" y="{top}" width="{WIDTH}" height="{LANE_H}" '
                'fill="currentColor" fill-opacity=".045"/>'
            )
        if lane is None:
            parts += _run_lane(timeline.run_marks, scale, top)
        else:
            parts += _lane(lane, scale, top)
    if timeline.open_ended:
        x = X1
        parts.append(
            f'<g class="af-tl-now"><title>now: {_clock(timeline.end)} (the run is still '
            f'active)</title><line x1="{x}" y1="{AXIS_H - 4}" x2="{x}" y2="{body_h}" '
            f'stroke="#2563eb" stroke-dasharray="2 3"/><text x="{x}" y="16" '
            'text-anchor="middle" fill="#2563eb" font-weight="600">now</text></g>'
        )
    parts += legend
    parts.append("</svg>")
    return mark_safe("".join(parts))  # every value above went through escape() or is a number


def describe(timeline: Timeline) -> str:
    """One sentence for screen readers and for the page's caption."""
    attempts = sum(lane.attempt_count for lane in timeline.lanes)
    gaps = sum(len(lane.gaps) for lane in timeline.lanes)
    sweeps = sum(
        1 for lane in timeline.lanes for m in lane.marks if m.kind == MarkKind.SWEEP
    ) + sum(1 for m in timeline.run_marks if m.kind == MarkKind.SWEEP)
    waits = sum(len(lane.wait_spans) for lane in timeline.lanes)
    steps = len(timeline.lanes)
    words = [
        f"{steps} step{'s' if steps != 1 else ''}",
        f"{attempts} attempt{'s' if attempts != 1 else ''}",
    ]
    if waits:
        words.append(f"{waits} wait{'s' if waits != 1 else ''}")
    if gaps:
        words.append(f"{gaps} crash gap{'s' if gaps != 1 else ''}")
    if sweeps:
        words.append(f"{sweeps} sweep{'s' if sweeps != 1 else ''}")
    length = span_text(timeline.end - timeline.start)
    if timeline.open_ended:
        return f"{', '.join(words)}; running for {length} since {_clock(timeline.start)}."
    return f"{', '.join(words)}; {length} from {_clock(timeline.start)} to {_clock(timeline.end)}."


# --- pieces -------------------------------------------------------------------------------------
def _axis(timeline: Timeline, scale: Scale, bottom: int) -> Iterator[str]:
    started = timezone.localtime(timeline.start).strftime("%Y-%m-%d %H:%M:%S %Z")
    yield (
        f'<text class="af-tl-caption" x="8" y="16" font-weight="600">Time since {escape(started)}'
        "</text>"
    )
    step = _tick_step(scale.seconds)
    for index in range(int(scale.seconds / step + 1e-9) + 1):
        value = round(index * step, 6)
        x = X0 + value / scale.seconds * (X1 - X0)
        at = timeline.start + timedelta(seconds=value)
        yield (
            f'<g class="af-tl-tick"><title>{_clock(at)}</title>'
            f'<line x1="{x:.1f}" y1="{AXIS_H - 4}" x2="{x:.1f}" y2="{bottom}" '
            'stroke="currentColor" stroke-opacity=".14"/>'
            f'<text x="{x:.1f}" y="{AXIS_H - 10}" text-anchor="middle" fill-opacity=".75">'
            f"{escape(_tick_label(value, step))}</text></g>"
        )


def _lane(lane: Lane, scale: Scale, top: int) -> Iterator[str]:
    name = lane.name if len(lane.name) <= NAME_CHARS else lane.name[: NAME_CHARS - 1] + "…"
    yield (
        f'<g class="af-tl-lane" data-seq="{lane.seq}" data-step="{escape(lane.name)}">'
        f"<title>#{lane.seq} {escape(lane.name)} ({escape(lane.kind)}): {escape(lane.summary)}"
        "</title>"
        f'<text class="af-tl-name" x="8" y="{top + 15}" font-weight="600">'
        f"#{lane.seq} {escape(name)}</text>"
        f'<text x="8" y="{top + 28}" font-size="9.5" fill-opacity=".65">{escape(lane.kind)}</text>'
        f'<text class="af-tl-summary" x="{X1 + 14}" y="{top + BAR_Y + 11}">'
        f"{escape(lane.summary)}</text>"
    )
    mid = top + BAR_Y + BAR_H / 2
    if lane.unrecorded is not None:
        yield _interval(lane, lane.unrecorded, scale, top, "af-tl-unrecorded")
    for gap in lane.gaps:
        yield _interval(lane, gap, scale, top, "af-tl-gap")
    for span in lane.wait_spans:
        yield _wait_bar(lane, span, scale, top)
    for wait in lane.waits:
        x0, x1 = scale.x(wait.start), scale.x(wait.end)
        cut = wait.note != "back-off"
        text = (
            f"{wait.note}, {span_text(wait.end - wait.start)}: from {_clock(wait.start)}, "
            f"next attempt {'began early' if cut else 'due'} at {_clock(wait.end)}"
        )
        yield (
            f'<g class="af-tl-wait" data-seq="{lane.seq}"><title>{escape(text)}</title>'
            f'<line x1="{x0:.1f}" y1="{mid}" x2="{max(x1, x0 + 1):.1f}" '
            f'y2="{mid}" stroke="{WAIT_COLOUR}" stroke-width="2" stroke-dasharray="4 3"/>'
            f'<line x1="{x1:.1f}" y1="{mid - 4}" x2="{x1:.1f}" y2="{mid + 4}" '
            f'stroke="{WAIT_COLOUR}" stroke-width="1.5"/></g>'
        )
    label_end = -1e9
    for index, attempt in enumerate(lane.attempts, start=1):
        x0, x1 = scale.x(attempt.start), scale.x(attempt.end)
        width = max(x1 - x0, MIN_BAR_W)
        yield _attempt(lane, attempt, index, x0, width, top)
        if len(lane.attempts) > 1 and x0 - label_end >= NUMBER_SPACING:
            label_end = x0
            yield (
                f'<text class="af-tl-number" x="{x0 + width / 2:.1f}" y="{top + LANE_H - 2}" '
                f'text-anchor="middle" font-size="9" fill-opacity=".8">{index}</text>'
            )
    for mark in lane.marks:
        yield _mark(mark, scale, top, lane.seq)
    yield "</g>"


def _attempt(lane: Lane, attempt: Attempt, index: int, x: float, width: float, top: int) -> str:
    fill, glyph, words = OUTCOME_STYLE[attempt.outcome]
    took = span_text(attempt.end - attempt.start)
    lines = [f"#{lane.seq} {lane.name}, attempt {index} of {len(lane.attempts)}: {glyph} {words}"]
    if attempt.outcome == Outcome.LOST:
        lines.append(f"claimed at {_clock(attempt.start)}; its worker was lost before it finished")
    elif attempt.outcome == Outcome.RUNNING:
        lines.append(f"since {_clock(attempt.start)} ({took} so far)")
    else:
        lines.append(f"{_clock(attempt.start)} → {_clock(attempt.end)} ({took})")
    if attempt.owner:
        lines.append(f"worker {attempt.owner}")
    if attempt.error:
        lines.append(attempt.error)
    inner = ""
    if width >= 16:
        inner = (
            f'<text x="{x + width / 2:.1f}" y="{top + BAR_Y + 11}" text-anchor="middle" '
            f'font-size="10" fill="#fff">{glyph}</text>'
        )
    return (
        f'<g class="af-tl-attempt af-tl-{attempt.outcome}" data-seq="{lane.seq}" '
        f'data-attempt="{index}" data-outcome="{attempt.outcome}">'
        f"<title>{escape(chr(10).join(lines))}</title>"
        f'<rect x="{x:.1f}" y="{top + BAR_Y}" width="{width:.1f}" height="{BAR_H}" rx="2" '
        f'fill="{fill}"/>{inner}</g>'
    )


def _wait_bar(lane: Lane, span: WaitSpan, scale: Scale, top: int) -> str:
    """The wait as a pale bar, outlined (dashed while open), its label inside when it fits,
    else under it."""
    colour, _ = WAIT_BAR_STYLE.get(span.kind, (WAIT_COLOUR, "waited"))
    x0 = scale.x(span.start)
    width = max(scale.x(span.end) - x0, MIN_BAR_W)
    branch = f" (branch {span.branch})" if span.branch is not None else ""
    if span.ended == WaitEnd.OPEN:
        lines = [f"#{lane.seq} waits for {span.what}{branch}"]
        lines.append(f"since {_clock(span.start)} ({span_text(span.end - span.start)} so far)")
    else:
        lines = [f"#{lane.seq} waited for {span.what}{branch}: {span.how}"]
        took = span_text(span.end - span.start)
        lines.append(f"{_clock(span.start)} → {_clock(span.end)} ({took})")
    if span.deadline is not None and span.ended in (WaitEnd.OPEN, WaitEnd.TIMED_OUT):
        lines.append(f"deadline {_clock(span.deadline)}")
    dashed = ' stroke-dasharray="3 2"' if span.ended == WaitEnd.OPEN else ""
    fits = int((width - 6) / (CHAR_W * WAIT_LABEL_SIZE / 11))
    if fits >= len(span.label):
        x, y, room = x0 + 3, top + BAR_Y + 10.5, fits
    else:  # under the bar, as far as the summary column
        x, y = x0, top + LANE_H - 2
        room = int((X1 - x0) / (CHAR_W * WAIT_LABEL_SIZE / 11))
    words = span.label if len(span.label) <= room else span.label[: max(room - 1, 0)] + "…"
    return (
        f'<g class="af-tl-wait-bar af-tl-wait-{escape(span.kind)}" data-seq="{lane.seq}" '
        f'data-kind="{escape(span.kind)}" data-ended="{span.ended}">'
        f"<title>{escape(chr(10).join(lines))}</title>"
        f'<rect x="{x0:.1f}" y="{top + BAR_Y}" width="{width:.1f}" height="{BAR_H}" rx="2" '
        f'fill="{colour}" fill-opacity=".16" stroke="{colour}" stroke-width="1.2"{dashed}/>'
        f'<text class="af-tl-wait-label" x="{x:.1f}" y="{y:.1f}" '
        f'font-size="{WAIT_LABEL_SIZE}">{escape(words)}</text></g>'
    )


def _interval(lane: Lane, interval: Interval, scale: Scale, top: int, css: str) -> str:
    x0, x1 = scale.x(interval.start), scale.x(interval.end)
    took = span_text(interval.end - interval.start)
    if css == "af-tl-gap":
        fill, stroke = "url(#af-tl-hatch-red)", "#dc2626"
        text = (
            f"crash gap, {took}: claimed at {_clock(interval.start)}, taken over at "
            f"{_clock(interval.end)} ({interval.note})"
        )
    else:
        fill, stroke = "url(#af-tl-hatch-grey)", "#94a3b8"
        text = f"{interval.note}: the first began at {_clock(interval.start)} ({took} before this)"
    return (
        f'<g class="{css}" data-seq="{lane.seq}"><title>{escape(text)}</title>'
        f'<rect x="{x0:.1f}" y="{top + BAR_Y + 1}" width="{max(x1 - x0, 1):.1f}" '
        f'height="{BAR_H - 2}" fill="{fill}" stroke="{stroke}" stroke-dasharray="3 2" '
        'stroke-width="1"/></g>'
    )


def _mark(mark: Mark, scale: Scale, top: int, seq: int | None) -> str:
    colour, _ = MARK_STYLE[mark.kind]
    x = scale.x(mark.at)
    y = top + 1
    shape = _shape(mark.kind, x, y, colour)
    where = f' data-seq="{seq}"' if seq is not None else ""
    return (
        f'<g class="af-tl-mark af-tl-mark-{mark.kind}" data-kind="{mark.kind}"{where}>'
        f"<title>{escape(_clock(mark.at))}: {escape(mark.label)}</title>{shape}</g>"
    )


def _shape(kind: MarkKind, x: float, y: float, colour: str) -> str:
    """A shape per kind, so marks differ by form as well as colour."""
    if kind == MarkKind.SWEEP:  # a triangle pointing down at the bar
        return f'<path d="M{x - 4.5:.1f},{y} h9 l-4.5,7 z" fill="{colour}"/>'
    if kind == MarkKind.OPERATOR:  # a diamond
        return f'<path d="M{x:.1f},{y - 1} l4,4.5 l-4,4.5 l-4,-4.5 z" fill="{colour}"/>'
    if kind == MarkKind.PARKED:  # a square
        return f'<rect x="{x - 4:.1f}" y="{y}" width="8" height="8" fill="{colour}"/>'
    if kind == MarkKind.COMPENSATION:  # a left-pointing triangle: undoing
        return f'<path d="M{x + 4:.1f},{y} v8 l-8,-4 z" fill="{colour}"/>'
    if kind == MarkKind.DIVERGED:  # a warning triangle, pointing up
        return f'<path d="M{x:.1f},{y - 1} l4.5,8.5 h-9 z" fill="{colour}"/>'
    if kind == MarkKind.FORK:  # a fork: one stem, two branches
        return (
            f'<path d="M{x:.1f},{y + 9} v-4 l-4,-4.5 M{x:.1f},{y + 5} l4,-4.5" fill="none" '
            f'stroke="{colour}" stroke-width="2.2" stroke-linecap="round"/>'
        )
    return f'<circle cx="{x:.1f}" cy="{y + 4}" r="4" fill="{colour}"/>'


def _run_lane(marks: list[Mark], scale: Scale, top: int) -> Iterator[str]:
    yield (
        f'<g class="af-tl-lane af-tl-run"><text x="8" y="{top + 15}" font-weight="600">Run</text>'
        f'<text x="8" y="{top + 28}" font-size="9.5" fill-opacity=".65">operators, parking, '
        "undoing</text>"
    )
    for mark in marks:
        yield _mark(mark, scale, top + BAR_Y - 1, None)
    yield "</g>"


def _legend(timeline: Timeline, *, top: int) -> tuple[list[str], int]:
    """Swatches with words for what this picture shows, wrapped into rows."""
    items: list[tuple[str, str]] = []
    for outcome, (fill, glyph, words) in OUTCOME_STYLE.items():
        if outcome in timeline.outcomes:
            swatch = f'<rect width="16" height="10" rx="2" fill="{fill}"/>'
            items.append((swatch, f"{glyph} {words}"))
    lanes = timeline.lanes
    if any(lane.waits for lane in lanes):
        swatch = (
            f'<line x1="0" y1="5" x2="16" y2="5" stroke="{WAIT_COLOUR}" stroke-width="2" '
            'stroke-dasharray="4 3"/>'
        )
        items.append((swatch, "back-off wait"))
    if any(lane.gaps for lane in lanes):
        swatch = (
            '<rect width="16" height="10" fill="url(#af-tl-hatch-red)" stroke="#dc2626" '
            'stroke-dasharray="3 2"/>'
        )
        items.append((swatch, "crash gap (claim → takeover)"))
    for kind, (colour, words) in WAIT_BAR_STYLE.items():
        if kind in timeline.wait_kinds:
            swatch = (
                f'<rect width="16" height="10" rx="2" fill="{colour}" fill-opacity=".16" '
                f'stroke="{colour}" stroke-width="1.2"/>'
            )
            items.append((swatch, words))
    if any(lane.unrecorded for lane in lanes):
        swatch = '<rect width="16" height="10" fill="url(#af-tl-hatch-grey)" stroke="#94a3b8"/>'
        items.append((swatch, "earlier attempts (no details)"))
    for kind, (colour, words) in MARK_STYLE.items():
        if kind in timeline.mark_kinds:
            items.append((_shape(kind, 8, 1, colour), words))
    if timeline.events_cut:
        items.append(("", "only the latest events are drawn"))
    parts, x, y = ['<g class="af-tl-legend">'], 8.0, float(top)
    for swatch, words in items:
        width = 22 + len(words) * CHAR_W + 18
        if x + width > WIDTH and x > 8:
            x, y = 8.0, y + 18
        parts.append(
            f'<g class="af-tl-legend-item" transform="translate({x:.1f},{y:.1f})">{swatch}'
            f'<text x="22" y="9.5">{escape(words)}</text></g>'
        )
        x += width
    parts.append("</g>")
    return parts, int(y - top) + 18


def _tick_step(seconds: float) -> float:
    for step in TICK_STEPS:
        if seconds / step <= TICKS_AT_MOST:
            return step
    return TICK_STEPS[-1]


def _tick_label(value: float, step: float) -> str:
    if value == 0:
        return "0"
    if value < 1:
        return f"+{value * 1000:.0f} ms"
    if step < 60:
        return f"+{value:g} s"
    if step < 3600:
        return f"+{value / 60:g} min"
    if step < 86400:
        return f"+{value / 3600:g} h"
    return f"+{value / 86400:g} d"


def _clock(at: datetime) -> str:
    """Local wall-clock time with milliseconds: what the hover titles and captions show."""
    return timezone.localtime(at).strftime("%H:%M:%S.%f")[:-3]
