"""The compiler's LNC follows the runtime's: NEURON_LOGICAL_NC_CONFIG adds --logical-nc-config to
NEURON_CC_FLAGS, and flags naming another LNC are refused."""

from __future__ import annotations

import pytest

from trainer import launch, stacks


def test_the_runtime_lnc_is_added_to_the_compiler_flags() -> None:
    env = launch.job_environment(
        {"NEURON_LOGICAL_NC_CONFIG": "1", "NEURON_CC_FLAGS": "--model-type transformer"},
        compiler="2.0",
        kernel_release="6.1",
    )

    assert env["NEURON_CC_FLAGS"] == "--model-type transformer --logical-nc-config=1"


def test_without_the_runtime_variable_the_flags_are_left_alone() -> None:
    env = launch.job_environment({"NEURON_CC_FLAGS": "-O1"}, compiler="2.0", kernel_release="6.1")
    assert env["NEURON_CC_FLAGS"] == "-O1"


@pytest.mark.parametrize("flags", ["-lnc 2", "--lnc=2", "--logical-nc-config 2", "-O1 -lnc=2"])
def test_flags_that_already_match_are_kept(flags: str) -> None:
    assert launch.with_lnc_flag(flags, "2") == flags


@pytest.mark.parametrize(
    ("flags", "option"), [("-lnc 2", "-lnc"), ("--logical-nc-config=2", "--logical-nc-config")]
)
def test_flags_naming_another_lnc_are_refused(flags: str, option: str) -> None:
    with pytest.raises(
        ValueError,
        match=rf"NEURON_CC_FLAGS sets {option} 2 but NEURON_LOGICAL_NC_CONFIG is 1",
    ):
        launch.job_environment(
            {"NEURON_LOGICAL_NC_CONFIG": "1", "NEURON_CC_FLAGS": flags},
            compiler="2.0",
            kernel_release="6.1",
        )


def test_the_compile_cache_key_differs_per_lnc() -> None:
    one, two = (
        launch.job_environment(
            {"NEURON_LOGICAL_NC_CONFIG": lnc},
            compiler="2.0",
            kernel_release="6.1",
        )
        for lnc in ("1", "2")
    )
    cache = stacks.STACKS["native"].cache_variable
    assert one[cache] != two[cache]
