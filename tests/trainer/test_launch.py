"""The entrypoint's environment and command lines (Docker cannot run here)."""

from pathlib import Path

import pytest

from trainer import launch

MULTI_NODE = {"NNODES": "4", "NODE_RANK": "2", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29400"}


def test_efa_and_neuron_defaults() -> None:
    env = launch.job_environment({}, compiler="2.27.5334.0", kernel_release="6.1.0-aws")
    assert env["FI_PROVIDER"] == "efa"
    assert env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert "FI_EFA_FORK_SAFE" not in env  # only needed before kernel 5.15
    assert env["NEURON_CC_FLAGS"] == launch.DEFAULT_CC_FLAGS
    assert env["MALLOC_ARENA_MAX"] == "64"
    assert "NEURON_RT_ROOT_COMM_ID" not in env  # single node


def test_fork_safe_on_old_kernels() -> None:
    env = launch.job_environment({}, compiler="x", kernel_release="5.10.226-214.880.amzn2.x86_64")
    assert env["FI_EFA_FORK_SAFE"] == "1"


def test_job_values_win_over_defaults() -> None:
    env = launch.job_environment(
        {"FI_PROVIDER": "tcp", "NEURON_CC_FLAGS": "-O1"}, compiler="x", kernel_release="6.1"
    )
    assert env["FI_PROVIDER"] == "tcp"
    assert env["NEURON_CC_FLAGS"] == "-O1"


def test_root_comm_id_for_several_nodes() -> None:
    env = launch.job_environment(MULTI_NODE, compiler="x", kernel_release="6.1")
    assert env["NEURON_RT_ROOT_COMM_ID"] == "10.0.0.5:29401"


def test_kubeflow_trainer_rendezvous_variables_are_understood() -> None:
    pet = {f"PET_{k}": v for k, v in MULTI_NODE.items()} | {"PET_NPROC_PER_NODE": "64"}
    env = launch.job_environment(pet, compiler="x", kernel_release="6.1")
    assert {k: env[k] for k in MULTI_NODE} == MULTI_NODE
    assert env["NEURON_RT_ROOT_COMM_ID"] == "10.0.0.5:29401"
    argv = launch.torchrun_argv(env, [])
    assert "--nnodes=4" in argv and "--node-rank=2" in argv and "--nproc-per-node=64" in argv


def test_ranks_follow_the_catalog_logical_cores() -> None:
    assert launch.ranks_per_node({"TRN_INSTANCE_TYPE": "trn2.48xlarge"}) == 64
    assert launch.ranks_per_node({"TRN_INSTANCE_TYPE": "trn1.32xlarge"}) == 32
    lnc1 = {"TRN_INSTANCE_TYPE": "trn3.48xlarge", "NEURON_LOGICAL_NC_CONFIG": "1"}
    assert launch.ranks_per_node(lnc1) == 128


def test_compile_cache_is_keyed_by_compiler_version_and_flags() -> None:
    base = {"NEURON_COMPILE_CACHE_URL": "s3://cache-bucket/neuron/"}
    a = launch.job_environment(base, compiler="2.27.5334.0", kernel_release="6.1")
    assert a["NEURON_COMPILE_CACHE_URL"].startswith(
        "s3://cache-bucket/neuron/neuronx-cc-2.27.5334.0/flags-"
    )
    newer = launch.job_environment(base, compiler="2.28.1.0", kernel_release="6.1")
    other_flags = launch.job_environment(
        {**base, "NEURON_CC_FLAGS": "--model-type transformer -O1"},
        compiler="2.27.5334.0",
        kernel_release="6.1",
    )
    assert (
        len(
            {
                a["NEURON_COMPILE_CACHE_URL"],
                newer["NEURON_COMPILE_CACHE_URL"],
                other_flags["NEURON_COMPILE_CACHE_URL"],
            }
        )
        == 3
    )
    spaced = launch.compile_cache_url(
        "/c", compiler="1", cc_flags="  --model-type   transformer --auto-cast=none"
    )
    assert spaced == launch.compile_cache_url("/c", compiler="1", cc_flags=launch.DEFAULT_CC_FLAGS)


def test_cache_key_is_stable_when_the_environment_is_rebuilt() -> None:
    once = launch.job_environment({}, compiler="1", kernel_release="6.1")
    twice = launch.job_environment(once, compiler="1", kernel_release="6.1")
    assert once["NEURON_COMPILE_CACHE_URL"] == twice["NEURON_COMPILE_CACHE_URL"]
    assert once["NEURON_COMPILE_CACHE_URL"].startswith(launch.DEFAULT_CACHE + "/neuronx-cc-1/")


def test_torchrun_single_node_uses_one_rank_per_logical_core() -> None:
    argv = launch.torchrun_argv({}, ["--preset", "1b"])
    # trn3.48xlarge: 128 NeuronCores at logical core size 2.
    assert argv[:3] == ["torchrun", "--nproc-per-node=64", "--standalone"]
    assert argv[3:] == [
        "-m",
        "trainer",
        "run",
        "--instance-type",
        "trn3.48xlarge",
        "--preset",
        "1b",
    ]


def test_torchrun_multi_node() -> None:
    argv = launch.torchrun_argv({**MULTI_NODE, "TRN_INSTANCE_TYPE": "trn1.32xlarge"}, [])
    assert argv[1:6] == [
        "--nproc-per-node=32",
        "--nnodes=4",
        "--node-rank=2",
        "--master-addr=10.0.0.5",
        "--master-port=29400",
    ]


def test_unknown_instance_type_is_named() -> None:
    with pytest.raises(KeyError, match=r"trn9\.1xlarge"):
        launch.torchrun_argv({"TRN_INSTANCE_TYPE": "trn9.1xlarge"}, [])


@pytest.mark.parametrize(
    ("stack", "prefix"), [("native", "torchrun"), ("xla", "neuron_parallel_compile")]
)
def test_precompile_pass_overrides_steps_and_outputs(stack: str, prefix: str) -> None:
    argv = launch.precompile_argv(
        {"NEURON_STACK": stack, "NPROC_PER_NODE": "2"},
        ["--max-steps", "1000", "--checkpoint-dir", "/fsx/ck", "--checkpoint-every", "50"],
    )
    assert argv[0] == prefix
    args = argv[argv.index("run") + 1 :]
    from trainer.cli import _parser

    parsed = _parser().parse_args(["run", "--data", "d", *args])
    assert (parsed.max_steps, parsed.checkpoint_dir, parsed.checkpoint_every, parsed.metrics) == (
        2,
        "",
        0,
        "",
    )


def test_entrypoint_script_calls_launch_main() -> None:
    text = (Path(__file__).parents[2] / "training_image" / "entrypoint.py").read_text()
    assert "from trainer.launch import main" in text
