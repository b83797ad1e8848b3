"""One exception tree with stable codes, mapped to exit codes in one place."""

import pytest

from berth import errors


@pytest.mark.parametrize(
    ("error", "code", "exit_code"),
    [
        (errors.ConfigError("x"), "berth.config.invalid", 2),
        (errors.PluginNotFound("x"), "berth.config.plugin_not_found", 2),
        (errors.CloudFileError("x"), "berth.input.cloud_file", 3),
        (errors.ExtraSpecError("x"), "berth.input.extra_spec", 3),
        (errors.NoValidHost(), "berth.scheduling.no_valid_host", 4),
        (errors.UnsupportedPolicy("x"), "berth.scheduling.unsupported_policy", 5),
        (errors.MaxRetriesExceeded("x"), "berth.scheduling.max_retries_exceeded", 6),
        (ValueError("not ours"), None, 1),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v),
)
def test_every_error_has_a_stable_code_and_an_exit_status(error, code, exit_code):
    assert getattr(error, "code", None) == code
    assert errors.exit_code_for(error) == exit_code


def test_no_valid_host_keeps_novas_terse_message_and_carries_the_diagnosis():
    err = errors.NoValidHost("There are not enough hosts available.", diagnosis="d")
    assert str(err) == "No valid host was found. There are not enough hosts available."
    assert err.diagnosis == "d"
    assert str(errors.NoValidHost()) == "No valid host was found."
