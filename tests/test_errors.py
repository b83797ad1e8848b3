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



# ------------------------------------------------------ categories as Nova's (issue 17)
def _schedule(filter_name, **fields):
    import random

    from berth import plugins
    from berth.config import SchedulerConfig
    from berth.pipeline import Scheduler
    from builders import NOW, cloud, host, spec

    config = SchedulerConfig.from_dict({"filter_scheduler": {"enabled_filters": [filter_name]}})
    sched = Scheduler(config, filters=plugins.load_filters(config), weighers=[])
    snapshot = cloud(host("a", host_ip=fields.pop("host_ip", "10.0.0.1"),
                          supported_instances=[["x86_64", "kvm", "hvm"]],
                          hypervisor_version=6000000, cpu_info=fields.pop("cpu_info", "{}")))
    sched.select_destinations(spec(**fields), snapshot, now=NOW, rng=random.Random(0))


@pytest.mark.parametrize(
    ("filter_name", "fields", "category", "code"),
    [
        ("ComputeCapabilitiesFilter", {"extra_specs": {"free_ram_mb": ">= lots"}},
         errors.ExtraSpecError, "berth.input.extra_spec"),
        ("NUMATopologyFilter", {"extra_specs": {"hw:numa_nodes": "zero"}},
         errors.ExtraSpecError, "berth.input.extra_spec"),
        ("JsonFilter", {"hints": {"query": "[\"=\""}},
         errors.SchedulerHintError, "berth.input.scheduler_hint"),
        ("SimpleCIDRAffinityFilter", {"hints": {"build_near_host_ip": "10.0.0.1", "cidr": "/99"}},
         errors.SchedulerHintError, "berth.input.scheduler_hint"),
        ("ImagePropertiesFilter", {"image_props": {"img_hv_requested_version": "six"}},
         errors.ImagePropertyError, "berth.input.image_property"),
        ("NUMATopologyFilter", {"image_props": {"hw_numa_nodes": 2},
                                "extra_specs": {"hw:numa_nodes": "2"}},
         errors.ImagePropertyError, "berth.input.image_property"),
        ("SimpleCIDRAffinityFilter", {"host_ip": "10.0.0",
                                      "hints": {"build_near_host_ip": "10.0.0.1", "cidr": "/24"}},
         errors.HostStateError, "berth.input.host_state"),
        ("ImagePropertiesFilter", {"cpu_info": '{"maxphysaddr": {"bits": "many"}}',
                                   "image_props": {"hw_architecture": "x86_64", "hw_maxphysaddr_bits": 40}},
         errors.HostStateError, "berth.input.host_state"),
    ],
    ids=["a non-numeric extra-spec operand is an extra-spec error",
         "a bad NUMA extra spec is an extra-spec error",
         "malformed JSON in the query hint is a hint error",
         "a cidr hint that makes no network is a hint error",
         "a version predicate that is no predicate is an image-property error",
         "an image repeating the flavor's NUMA nodes is an image-property error",
         "a host IP that is no address is a host-state error",
         "cpu_info bits that are no number are a host-state error"],
)
def test_errors_carry_the_category_novas_would(filter_name, fields, category, code):
    with pytest.raises(category) as caught:
        _schedule(filter_name, **fields)
    assert caught.value.code == code
    assert errors.exit_code_for(caught.value) == 3
    assert "Traceback" not in str(caught.value)


def _subclasses(cls: type) -> list[type]:
    return [cls] + [c for sub in cls.__subclasses__() for c in _subclasses(sub)]


@pytest.mark.parametrize("cls", _subclasses(errors.BerthError), ids=lambda c: c.__name__)
def test_an_error_pickles_whole_whatever_its_constructor(cls):
    """A worker process sends its error to its parent pickled: the class, message and
    details come back, including classes whose constructor takes other arguments."""
    import pickle

    error = cls.__new__(cls, "what went wrong")
    errors.BerthError.__init__(error, "what went wrong", field="trace")
    error.extra = [1, 2]
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is cls and back.args == error.args
    assert back.message == "what went wrong" and back.details == {"field": "trace"}
    assert back.extra == [1, 2] and back.code == cls.code


def test_a_no_valid_host_pickles_with_its_diagnosis():
    import pickle

    err = errors.NoValidHost("none left", diagnosis="d", cause="placement")
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == str(err) and back.diagnosis == "d" and back.cause == "placement"
