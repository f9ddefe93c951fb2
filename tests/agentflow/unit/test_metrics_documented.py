"""Every metric the engine exposes is named in the manual (issue 37 found
`agentflow_database_up` served and never explained)."""

from __future__ import annotations

import re
from pathlib import Path

from agentflow._observe import metrics

ROOT = Path(__file__).resolve().parents[3]


def test_metrics__each_name_served_is_in_the_docs() -> None:
    source = Path(metrics.__file__).read_text()
    served = set(re.findall(r'"(agentflow_[a-z_]+)"', source))
    manual = "\n".join(page.read_text() for page in (ROOT / "docs").rglob("*.md"))

    assert {"agentflow_database_up", "agentflow_stray_step_messages"} <= served
    assert sorted(name for name in served if name not in manual) == []
