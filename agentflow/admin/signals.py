"""What the run page shows of a run's signals: each one sent, and which wait took it, or that it
is still kept (sent before the run got to a `wait_for` of its name, or one that never came: an
operator sees it rather than wondering where the partner's message went)."""

from __future__ import annotations

from django.utils.html import format_html, format_html_join

from agentflow.admin.display import pretty, when
from agentflow.admin.privacy import Privacy
from agentflow.models import RunSignal, WorkflowRun

#: The newest signals shown; a run is sent a handful, a runaway partner could send thousands.
SHOWN = 50


def signals_block(run: WorkflowRun, shown: Privacy) -> str:
    """The run's signals, newest first: id, name, when it came, and what took it (`shown`: the
    viewer's privacy, which masks a sensitive value a partner's payload repeats)."""
    rows = list(RunSignal.objects.filter(run=run).order_by("-id")[:SHOWN])
    if not rows:
        return "—"
    return format_html(
        '<table class="af-waits af-signals"><thead><tr><th>signal id</th><th>name</th>'
        "<th>received</th><th>taken by</th><th>payload</th></tr></thead><tbody>{}</tbody>"
        "</table>",
        format_html_join("", "<tr>{}</tr>", ((_row(run, signal, shown),) for signal in rows)),
    )


def _row(run: WorkflowRun, signal: RunSignal, shown: Privacy) -> str:
    if signal.consumed_at is None:
        taken = format_html(
            '<span class="af-parked">kept: no wait_for({}) has taken it</span>', signal.name
        )
    else:
        other = f" (branch {signal.branch})" if signal.branch != run.branch else ""
        taken = format_html("the wait at #{}{}, {}", signal.seq, other, when(signal.consumed_at))
    return format_html(
        "<td><code>{}</code></td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td>",
        signal.signal_id,
        signal.name,
        when(signal.received_at),
        taken,
        pretty(shown.value(signal.payload)),
    )
