"""The entrypoint's environment and command lines (Docker cannot run here)."""

import importlib.machinery
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer import launch, stacks
from trainer.cli import _parser

NATIVE, XLA = stacks.STACKS["native"], stacks.STACKS["xla"]

MULTI_NODE = {"NNODES": "4", "NODE_RANK": "2", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29400"}


def test_efa_and_neuron_defaults() -> None:
    env = launch.job_environment({}, compiler="2.27.5334.0", kernel_release="6.1.0-aws")
    assert env["FI_PROVIDER"] == "efa"
    assert env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert "FI_EFA_FORK_SAFE" not in env  # only needed before kernel 5.15
    assert env["NEURON_CC_FLAGS"] == NATIVE.cc_flags
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


def test_root_comm_id_is_left_to_the_framework() -> None:
    """TorchNeuron picks a free port on MASTER_ADDR itself; MASTER_PORT + 1 may be taken. A value
    the job sets is passed through."""
    env = launch.job_environment(MULTI_NODE, compiler="x", kernel_release="6.1")
    assert "NEURON_RT_ROOT_COMM_ID" not in env
    chosen = MULTI_NODE | {"NEURON_RT_ROOT_COMM_ID": "10.0.0.5:45000"}
    env = launch.job_environment(chosen, compiler="x", kernel_release="6.1")
    assert env["NEURON_RT_ROOT_COMM_ID"] == "10.0.0.5:45000"


def test_kubeflow_trainer_rendezvous_variables_are_understood() -> None:
    pet = {f"PET_{k}": v for k, v in MULTI_NODE.items()} | {"PET_NPROC_PER_NODE": "64"}
    env = launch.job_environment(pet, compiler="x", kernel_release="6.1")
    assert {k: env[k] for k in MULTI_NODE} == MULTI_NODE
    argv = launch.torchrun_argv(env, [])
    assert "--nnodes=4" in argv and "--node-rank=2" in argv and "--nproc-per-node=64" in argv


def test_ranks_follow_the_catalog_logical_cores() -> None:
    assert launch.ranks_per_node({"TRN_INSTANCE_TYPE": "trn2.48xlarge"}) == 64
    assert launch.ranks_per_node({"TRN_INSTANCE_TYPE": "trn1.32xlarge"}) == 32
    lnc1 = {"TRN_INSTANCE_TYPE": "trn3.48xlarge", "NEURON_LOGICAL_NC_CONFIG": "1"}
    assert launch.ranks_per_node(lnc1) == 128


def test_the_catalog_wins_over_the_cpu_count_kubeflow_injects(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Trainer 2.3.0 sets PET_NPROC_PER_NODE to the pod's CPU request (184 on trn2.48xlarge) when
    the TrainJob names no numProcPerNode: the launcher runs one rank per logical NeuronCore."""
    pod = {f"PET_{k}": v for k, v in MULTI_NODE.items()} | {
        "PET_NPROC_PER_NODE": "184",
        "TRN_INSTANCE_TYPE": "trn2.48xlarge",
    }
    env = launch.job_environment(pod, compiler="x", kernel_release="6.1")

    argv = launch.torchrun_argv(env, [])

    assert "--nproc-per-node=64" in argv
    assert capsys.readouterr().err == (
        "launch: trn2.48xlarge has 64 logical NeuronCores (NEURON_LOGICAL_NC_CONFIG=2); running "
        "64 ranks per node, not NPROC_PER_NODE=184\n"
    )


@pytest.mark.parametrize("given", ["auto", "cpu", "gpu", "0", "-1", "8"])
def test_a_contradicting_rank_count_never_stops_a_job(
    given: str, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {"PET_NPROC_PER_NODE": given, "TRN_INSTANCE_TYPE": "trn1.32xlarge"}

    assert launch.ranks_per_node(env) == 32
    assert f"running 32 ranks per node, not PET_NPROC_PER_NODE={given}" in capsys.readouterr().err


def test_a_count_that_agrees_with_the_catalog_is_taken_silently(
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = {"NPROC_PER_NODE": "64", "TRN_INSTANCE_TYPE": "trn3.48xlarge"}

    assert launch.ranks_per_node(env) == 64
    assert capsys.readouterr().err == ""


def test_outside_a_job_a_whole_count_is_taken_and_none_is_one_rank(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert launch.ranks_per_node({"NPROC_PER_NODE": "2"}) == 2  # a CPU run, no instance type
    assert launch.ranks_per_node({}) == 1
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("variable", "given"), [("NPROC_PER_NODE", "auto"), ("PET_NPROC_PER_NODE", "0")]
)
def test_outside_a_job_a_count_that_is_no_number_is_refused(variable: str, given: str) -> None:
    """No instance type is guessed: the catalog's count for a type the node may not be would
    start the wrong number of ranks."""
    with pytest.raises(
        ValueError,
        match=rf"^{variable}='{given}' is not a whole number of ranks, and without "
        r"TRN_INSTANCE_TYPE the catalog cannot count them: name the node's type in "
        r"TRN_INSTANCE_TYPE or give a count$",
    ):
        launch.ranks_per_node({variable: given})


@pytest.mark.parametrize("lnc", ["3", "0", "two"])
def test_a_logical_core_size_that_does_not_divide_the_cores_is_refused(lnc: str) -> None:
    env = {"TRN_INSTANCE_TYPE": "trn2.48xlarge", "NEURON_LOGICAL_NC_CONFIG": lnc}

    with pytest.raises(
        ValueError,
        match=rf"NEURON_LOGICAL_NC_CONFIG '{lnc}' does not divide the 128 NeuronCores of "
        r"trn2\.48xlarge; use 1 or 2",
    ):
        launch.ranks_per_node(env)


def test_native_stack_leaves_casting_to_torch_autocast() -> None:
    env = launch.job_environment({"NEURON_STACK": "native"}, compiler="x", kernel_release="6.1")
    assert "--auto-cast=none" in env["NEURON_CC_FLAGS"].split()


def test_xla_stack_asks_the_compiler_to_cast_matmuls_to_bf16() -> None:
    """The XLA backend does not autocast, and neuronx-cc's --auto-cast defaults to none since
    Neuron 2.27: without the flag its matmuls would run in FP32."""
    env = launch.job_environment({"NEURON_STACK": "xla"}, compiler="x", kernel_release="6.1")
    flags = env["NEURON_CC_FLAGS"].split()
    assert "--auto-cast=matmult" in flags and "--auto-cast-type=bf16" in flags
    assert "--model-type" in flags


def test_compile_cache_is_keyed_by_compiler_version_and_flags() -> None:
    base = {"NEURON_STACK": "xla", "NEURON_COMPILE_CACHE_URL": "s3://cache-bucket/neuron/"}
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
    assert spaced == launch.compile_cache_url("/c", compiler="1", cc_flags=NATIVE.cc_flags)


@pytest.mark.parametrize("stack", [NATIVE, XLA])
def test_cache_key_is_stable_when_the_environment_is_rebuilt(stack: stacks.NeuronStack) -> None:
    once = launch.job_environment({"NEURON_STACK": stack.name}, compiler="1", kernel_release="6.1")
    twice = launch.job_environment(once, compiler="1", kernel_release="6.1")
    assert once[stack.cache_variable] == twice[stack.cache_variable]
    assert once[stack.cache_variable].startswith(stack.default_cache + "/neuronx-cc-1/")


# What the workspace's runtime puts in the pod (see constructs_lib.workspace).
POD = {
    "NEURON_COMPILE_CACHE_URL": "s3://trn-dev-cache/neuron-compile-cache",
    "TORCH_NEURONX_NEFF_CACHE_DIR": "/fsx/neuron-cache/neff",
}


def test_native_stack_caches_neffs_on_fsx_where_torchneuron_reads() -> None:
    """TorchNeuron reads TORCH_NEURONX_NEFF_CACHE_DIR (a path), not NEURON_COMPILE_CACHE_URL."""
    env = launch.job_environment(
        {**POD, "NEURON_STACK": "native"}, compiler="2.27", kernel_release="6.1"
    )
    assert env["TORCH_NEURONX_NEFF_CACHE_DIR"].startswith(
        "/fsx/neuron-cache/neff/neuronx-cc-2.27/flags-"
    )
    assert env["NEURON_COMPILE_CACHE_URL"] == POD["NEURON_COMPILE_CACHE_URL"]  # unread here


def test_xla_stack_keeps_the_s3_compile_cache() -> None:
    env = launch.job_environment(
        {**POD, "NEURON_STACK": "xla"}, compiler="2.27", kernel_release="6.1"
    )
    assert env["NEURON_COMPILE_CACHE_URL"].startswith(
        "s3://trn-dev-cache/neuron-compile-cache/neuronx-cc-2.27/flags-"
    )
    assert env["TORCH_NEURONX_NEFF_CACHE_DIR"] == POD["TORCH_NEURONX_NEFF_CACHE_DIR"]


def test_native_neff_cache_directory_is_created(tmp_path: Path) -> None:
    env = launch.job_environment(
        {"NEURON_STACK": "native", "TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "fsx" / "neff")},
        compiler="1",
        kernel_release="6.1",
    )
    launch.prepare_cache(env)
    assert Path(env["TORCH_NEURONX_NEFF_CACHE_DIR"]).is_dir()
    launch.prepare_cache(env)  # a second node finds it there


def test_xla_cache_is_left_to_its_compiler(tmp_path: Path) -> None:
    env = launch.job_environment(
        {"NEURON_STACK": "xla", "NEURON_COMPILE_CACHE_URL": str(tmp_path / "cache")},
        compiler="1",
        kernel_release="6.1",
    )
    launch.prepare_cache(env)
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("flag", ["--cache_dir=s3://mine/cache", "--cache_dir"])
def test_a_cache_dir_flag_on_the_xla_stack_is_refused(flag: str) -> None:
    """Neuron's compiler wrapper prefers --cache_dir to NEURON_COMPILE_CACHE_URL: the job would
    leave the shared, keyed cache without a word."""
    env = {"NEURON_STACK": "xla", "NEURON_CC_FLAGS": f"--model-type transformer {flag}"}
    with pytest.raises(
        ValueError,
        match=rf"^NEURON_CC_FLAGS sets {re.escape(flag)}, which the Neuron compiler wrapper "
        r"puts before NEURON_COMPILE_CACHE_URL: the job would miss the platform's shared "
        r"compile cache; drop the flag \(to move the cache, set NEURON_COMPILE_CACHE_URL, "
        r"which the launcher keys by compiler and flags\)$",
    ):
        launch.job_environment(env, compiler="2.24", kernel_release="6.1")


def test_unknown_stack_is_refused() -> None:
    with pytest.raises(ValueError, match=r"NEURON_STACK 'tpu' is unknown; use native or xla"):
        launch.job_environment({"NEURON_STACK": "tpu"}, compiler="1", kernel_release="6.1")


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"NEURON_STACK": "native", "TRN_INSTANCE_TYPE": "trn2.48xlarge"}, None),
        (
            {"NEURON_STACK": "native"},
            r"^the native stack needs the node's Trainium instance type \(the trainer's "
            r"--instance-type; in the image, TRN_INSTANCE_TYPE, which the platform's pods set\), "
            r"one of: trn1\.32xlarge, .*trn3\.48xlarge",
        ),
        ({"NEURON_STACK": "xla"}, r"^the xla stack needs the node's Trainium instance type"),
        ({}, None),  # outside the image: nothing to check
        ({"NEURON_STACK": "xla", "TRN_INSTANCE_TYPE": "trn1.32xlarge"}, None),
        (
            {"NEURON_STACK": "native", "TRN_INSTANCE_TYPE": "trn1n.32xlarge"},
            r"trn1n\.32xlarge is Trainium1, .* native stack does not support; use the xla "
            r"stack \(build the image with --build-arg NEURON_STACK=xla\)",
        ),
        ({"TRN_INSTANCE_TYPE": "trn1.32xlarge"}, r"which the native stack does not support"),
        ({"NEURON_STACK": "tpu"}, r"NEURON_STACK 'tpu' is unknown"),
        ({"TRN_INSTANCE_TYPE": "trn9.1xlarge"}, r"'trn9\.1xlarge' is not in the instance catalog"),
    ],
)
def test_stack_problem(env: dict[str, str], problem: str | None) -> None:
    found = launch.stack_problem(env)
    if problem is None:
        assert found is None
    else:
        assert found is not None and re.search(problem, found), found


def test_entrypoint_refuses_native_on_trn1_before_starting_torchrun(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NEURON_STACK", "native")
    monkeypatch.setenv("TRN_INSTANCE_TYPE", "trn1.32xlarge")

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("torchrun must not start")

    monkeypatch.setattr(launch.subprocess, "Popen", refuse)
    monkeypatch.setattr(launch.subprocess, "run", refuse)
    assert launch.main(["--preset", "125m"]) == 2
    assert "NEURON_STACK=xla" in capsys.readouterr().err


def test_torchrun_single_node_uses_one_rank_per_logical_core() -> None:
    argv = launch.torchrun_argv({"TRN_INSTANCE_TYPE": "trn3.48xlarge"}, ["--preset", "1b"])
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


def test_outside_the_platform_no_instance_type_is_named_to_the_trainer() -> None:
    argv = launch.torchrun_argv({}, ["--preset", "1b"])
    head = ["torchrun", "--nproc-per-node=1", "--standalone"]
    assert argv == [*head, "-m", "trainer", "run", "--preset", "1b"]


@pytest.mark.parametrize(
    ("env", "error"),
    [
        ({"NEURON_STACK": "native"}, "error: the native stack needs the node's Trainium instance"),
        ({"NPROC_PER_NODE": "auto"}, "error: NPROC_PER_NODE='auto' is not a whole number"),
    ],
)
def test_the_entrypoint_refuses_to_guess_the_node_before_starting_torchrun(
    env: dict[str, str],
    error: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    for name in ("NEURON_STACK", "TRN_INSTANCE_TYPE", "NPROC_PER_NODE", "PET_NPROC_PER_NODE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path / "neff"))

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("torchrun must not start")

    monkeypatch.setattr(launch.subprocess, "Popen", refuse)
    monkeypatch.setattr(launch.subprocess, "run", refuse)
    assert launch.main(["--preset", "125m"]) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(error)


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
    args = argv[argv.index("compile") + 1 :]
    from trainer.cli import _parser, compile_config

    cfg = compile_config(_parser().parse_args(["compile", "--data", "d", *args]))
    assert (cfg.max_steps, cfg.checkpoint_dir, cfg.checkpoint_every, cfg.metrics) == (2, "", 0, "")


@pytest.mark.parametrize(("stack", "device"), [("native", "neuron"), ("xla", "xla")])
def test_the_image_stack_names_the_trainer_device(stack: str, device: str) -> None:
    """An image for Neuron never falls back to CPU silently: a missing device is an error."""
    argv = launch.torchrun_argv({"NEURON_STACK": stack, "NPROC_PER_NODE": "2"}, ["--preset", "1b"])
    parsed = _parser().parse_args(["run", "--data", "d", *argv[argv.index("run") + 1 :]])
    assert parsed.device == device
    override = launch.torchrun_argv(
        {"NEURON_STACK": stack, "NPROC_PER_NODE": "2"}, ["--device", "cpu"]
    )
    assert (
        _parser().parse_args(["run", "--data", "d", *override[override.index("run") + 1 :]]).device
        == "cpu"
    )


def test_shutdown_timeout_comes_from_the_workspace() -> None:
    env = {"NPROC_PER_NODE": "2", "TRN_SHUTDOWN_TIMEOUT_S": "270"}
    argv = launch.torchrun_argv(env, [], shutdown_flag=True)
    assert (
        "--shutdown-timeout=270" in argv[: argv.index("-m")]
    )  # a torchrun flag, not a trainer one
    assert "--shutdown-timeout=30" in launch.torchrun_argv(
        {"NPROC_PER_NODE": "2"}, [], shutdown_flag=True
    )
    assert not any(a.startswith("--shutdown-timeout") for a in launch.torchrun_argv(env, []))


def test_shutdown_timeout_is_detected_in_the_installed_torchrun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert launch.torchrun_takes_shutdown_timeout()  # this venv's torch 2.13 has it
    old_torch = tmp_path / "torch"
    (old_torch / "distributed").mkdir(parents=True)
    (old_torch / "distributed" / "run.py").write_text('parser.add_argument("--max-restarts")\n')
    spec = importlib.machinery.ModuleSpec("torch", None, is_package=True)
    spec.submodule_search_locations = [str(old_torch)]
    monkeypatch.setattr(launch.importlib.util, "find_spec", lambda name: spec)
    assert not launch.torchrun_takes_shutdown_timeout()


@pytest.mark.parametrize(
    ("code", "terminated", "status"),
    [(0, False, 0), (0, True, 143), (1, True, 1), (1, False, 1), (-9, True, 137)],
)
def test_exit_status(code: int, terminated: bool, status: int) -> None:
    """A SIGTERM'd run never exits 0: Kubernetes must not mark an unfinished job Succeeded."""
    assert launch.exit_status(code, terminated=terminated) == status


def test_worker_pids_are_the_children_of_a_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in launch.worker_pids(os.getpid())
        assert launch.worker_pids(child.pid) == []
    finally:
        child.kill()
        child.wait()


# A worker that, like the trainer, answers SIGTERM by writing a checkpoint (taking a second)
# and exiting with the code in its second argument.
WORKER = """
import os, signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
def stop(signum, frame):
    time.sleep(1.0)
    (out / f"checkpoint-{os.getpid()}").touch()
    sys.exit(int(sys.argv[2]))
signal.signal(signal.SIGTERM, stop)
(out / f"ready-{os.getpid()}").touch()
while True:
    time.sleep(0.05)
"""
# A launcher that, signalled itself, SIGKILLs its workers at once: torchrun without enough
# shutdown timeout.
IMPATIENT_TORCHRUN = """
import signal, subprocess, sys
workers = [subprocess.Popen([sys.executable, *sys.argv[1:]]) for _ in range(2)]
def kill(signum, frame):
    for w in workers:
        w.kill()
    sys.exit(1)
signal.signal(signal.SIGTERM, kill)
sys.exit(max(w.wait() for w in workers))
"""


def _entrypoint_under_sigterm(argv: list[str], out: Path, ready: int) -> int:
    """Runs _run_forwarding_sigterm(argv) in its own process, SIGTERMs it once ``ready``
    workers are up, and returns its exit status."""
    code = (
        "import os, sys\n"
        "from trainer import launch\n"
        f"sys.exit(launch._run_forwarding_sigterm({argv!r}, os.environ))"
    )
    entry = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 60
    while len(list(out.glob("ready-*"))) < ready:
        assert entry.poll() is None and time.monotonic() < deadline, "workers did not start"
        time.sleep(0.05)
    entry.send_signal(signal.SIGTERM)
    return entry.wait(timeout=60)


@pytest.mark.parametrize(("worker_code", "status"), [(0, launch.PREEMPTED_EXIT), (3, 3)])
def test_sigterm_goes_to_the_workers_and_the_run_ends_interrupted(
    tmp_path: Path, worker_code: int, status: int
) -> None:
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "torchrun.py").write_text(IMPATIENT_TORCHRUN)
    argv = [
        sys.executable,
        str(tmp_path / "torchrun.py"),
        str(tmp_path / "worker.py"),
        str(tmp_path),
        str(worker_code),
    ]
    assert _entrypoint_under_sigterm(argv, tmp_path, ready=2) == status
    # Both workers finished their checkpoint: the signal went past torchrun, which would have
    # killed them.
    assert len(list(tmp_path.glob("checkpoint-*"))) == 2


@pytest.mark.slow
def test_real_torchrun_exits_0_when_its_workers_checkpoint_and_the_pod_still_fails(
    tmp_path: Path,
) -> None:
    (tmp_path / "worker.py").write_text(WORKER)
    torchrun = str(Path(sys.executable).parent / "torchrun")
    argv = [
        torchrun,
        "--standalone",
        "--nproc-per-node=2",
        str(tmp_path / "worker.py"),
        str(tmp_path),
        "0",
    ]
    assert _entrypoint_under_sigterm(argv, tmp_path, ready=2) == launch.PREEMPTED_EXIT
    assert len(list(tmp_path.glob("checkpoint-*"))) == 2


def test_a_finished_run_exits_0(tmp_path: Path) -> None:
    assert launch._run_forwarding_sigterm([sys.executable, "-c", "pass"], os.environ) == 0


def test_entrypoint_script_calls_launch_main() -> None:
    text = (Path(__file__).parents[2] / "training_image" / "entrypoint.py").read_text()
    assert "from trainer.launch import main" in text
