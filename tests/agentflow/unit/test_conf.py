"""Every engine setting has a default, and the settings table of the manual says each one."""

from __future__ import annotations

from pathlib import Path

from django.test import override_settings

from agentflow._conf import DEFAULTS, settings

SETTINGS_PAGE = (Path(__file__).resolve().parents[3] / "docs" / "settings.md").read_text()


def test_every_setting__is_in_the_docs_settings_table() -> None:
    missing = [name for name in DEFAULTS if f"| `{name}` |" not in SETTINGS_PAGE]
    assert not missing, f"docs/settings.md's table lacks {missing}"


def test_a_setting_the_host_leaves_out__reads_its_default() -> None:
    with override_settings():
        from django.conf import settings as django_settings

        del django_settings.AGENTFLOW_MAX_ATTEMPTS
        assert DEFAULTS["AGENTFLOW_MAX_ATTEMPTS"][0] == settings.AGENTFLOW_MAX_ATTEMPTS
    with override_settings(AGENTFLOW_MAX_ATTEMPTS=3):
        assert settings.AGENTFLOW_MAX_ATTEMPTS == 3  # the host's own value wins


def test_an_unknown_name__is_still_an_attribute_error() -> None:
    try:
        settings.AGENTFLOW_NO_SUCH_SETTING  # noqa: B018
    except AttributeError:
        return
    raise AssertionError("an unknown setting must not read as a default")
