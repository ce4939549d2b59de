"""The launch path on a GPU node of the cuda-torch runtime (TRN_GPU_INSTANCE_TYPE set): ranks per
node from the GPU catalog, device cuda, no Neuron stack checks, compiler flags or compile cache,
NCCL's EFA environment where the image has libfabric and aws-ofi-nccl, and a run header and MFU
peak from the GPU catalog. The decisions as pure functions; the entrypoint as a real process on
CPU, with a stand-in torchrun that records what it was asked to run."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

import trn_catalog
from trainer import launch, metrics, runlog
from trainer.cli import _parser, train_config
from trainer.device import CudaBackend

ENTRYPOINT = Path(__file__).parents[2] / "training_image" / "entrypoint.py"
P5 = trn_catalog.get_gpu("p5.48xlarge")
GPU = {"TRN_GPU_INSTANCE_TYPE": "p5.48xlarge"}
RENDEZVOUS = {
    "PET_NNODES": "2",
    "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "run-p5-node-0-0.run-p5",
    "PET_MASTER_PORT": "29400",
}
NEURON_VARIABLES = (
    "NEURON_CC_FLAGS",
    "TORCH_NEURONX_NEFF_CACHE_DIR",
    "TRN_NEFF_CACHE_BASE",
    "NEURON_COMPILE_CACHE_URL",
    "NEURON_COMPILE_CACHE_BASE",
    "MALLOC_ARENA_MAX",
)


# --- decisions ------------------------------------------------------------------------------


@pytest.mark.parametrize("gpu_type", sorted(trn_catalog.GPU_CATALOG))
def test_a_gpu_node_runs_a_rank_per_gpu_whatever_kubeflow_says(
    gpu_type: str, capsys: pytest.CaptureFixture[str]
) -> None:
    gpus = trn_catalog.get_gpu(gpu_type).gpus
    # Trainer 2.3.0 hands torchrun `auto` when a GPU job names no numProcPerNode.
    env = {"TRN_GPU_INSTANCE_TYPE": gpu_type, "PET_NPROC_PER_NODE": "auto"}

    assert launch.ranks_per_node(env) == gpus
    assert f"{gpu_type} has {gpus} GPUs; running {gpus} ranks per node" in capsys.readouterr().err
    assert launch.ranks_per_node({**env, "PET_NPROC_PER_NODE": str(gpus)}) == gpus
    assert capsys.readouterr().err == ""


def test_the_trainer_runs_on_cuda_with_the_gpu_type() -> None:
    env = launch.gpu_environment({**GPU, **RENDEZVOUS}, P5, efa_in_image=False)

    argv = launch.torchrun_argv(env, ["--preset", "tiny"])

    assert argv[:6] == [
        "torchrun",
        "--nproc-per-node=8",
        "--nnodes=2",
        "--node-rank=1",
        "--master-addr=run-p5-node-0-0.run-p5",
        "--master-port=29400",
    ]
    assert argv[6:] == [
        *["-m", "trainer", "run", "--instance-type", "p5.48xlarge", "--device", "cuda"],
        *["--preset", "tiny"],
    ]


def test_the_gpu_type_and_the_catalog_peak_reach_the_trainer() -> None:
    """What the launcher passes becomes the trainer's instance type, whose CUDA peak per rank is
    the GPU catalog's dense BF16 figure per GPU (no CUDA call: the catalog answers)."""
    argv = launch.torchrun_argv(GPU, ["--data", "d"])
    args = _parser().parse_args(argv[argv.index("run") :])
    cfg = train_config(args)

    assert (cfg.instance_type, cfg.device) == ("p5.48xlarge", "cuda")
    assert CudaBackend().peak_flops(instance_type=cfg.instance_type) == 989.5e12


@pytest.mark.parametrize("gpu_type", sorted(trn_catalog.GPU_CATALOG))
def test_the_cuda_peak_of_every_catalog_type_is_its_bf16_dense_peak(gpu_type: str) -> None:
    spec = trn_catalog.get_gpu(gpu_type)

    assert CudaBackend().peak_flops(instance_type=gpu_type) == spec.bf16_tflops_per_gpu * 1e12
    assert runlog.catalog_peak_flops_per_rank(gpu_type, {}) == spec.bf16_tflops_per_gpu * 1e12


def test_the_run_header_names_the_gpu_type() -> None:
    header = metrics.run_header(
        started_at=datetime(2026, 12, 1, tzinfo=UTC),
        nodes=2,
        world_size=16,
        device="cuda",
        precision="bf16 autocast",
        model="125m",
        seq_len=2048,
        global_batch_tokens=16 * 2048,
        flops_per_token=1.0e9,
        peak_flops_per_rank=989.5e12,
        env=GPU,
    )

    assert header["instance_type"] == "p5.48xlarge"
    assert metrics.node_instance_type({"TRN_INSTANCE_TYPE": "trn3.48xlarge"}) == "trn3.48xlarge"
    assert metrics.node_instance_type({}) is None


def test_nccl_goes_over_efa_where_the_image_has_it() -> None:
    env = launch.gpu_environment(GPU, P5, efa_in_image=True, kernel_release="6.1.0-aws")

    assert (env["FI_PROVIDER"], env["FI_EFA_USE_DEVICE_RDMA"]) == ("efa", "1")
    assert "FI_EFA_FORK_SAFE" not in env
    assert not set(NEURON_VARIABLES) & set(env)
    old_kernel = launch.gpu_environment(GPU, P5, efa_in_image=True, kernel_release="5.10.1")
    assert old_kernel["FI_EFA_FORK_SAFE"] == "1"


def test_across_nodes_nccl_must_use_the_efa_plugin() -> None:
    """Without NCCL_NET, NCCL takes its TCP sockets when aws-ofi-nccl fails to start, and the
    GPU side of a comparison runs over TCP without a word; on one node no network is needed."""
    across = launch.gpu_environment(
        {**GPU, **RENDEZVOUS}, P5, efa_in_image=True, kernel_release="6.1"
    )
    assert across["NCCL_NET"] == "Libfabric"
    one_node = launch.gpu_environment(GPU, P5, efa_in_image=True, kernel_release="6.1")
    assert "NCCL_NET" not in one_node
    no_plugin = launch.gpu_environment(
        {**GPU, **RENDEZVOUS}, P5, efa_in_image=False, kernel_release="6.1"
    )
    assert "NCCL_NET" not in no_plugin
    mine = {**GPU, **RENDEZVOUS, "NCCL_NET": "Socket"}
    kept = launch.gpu_environment(mine, P5, efa_in_image=True, kernel_release="6.1")
    assert kept["NCCL_NET"] == "Socket"


def test_device_rdma_only_on_types_whose_efa_has_it() -> None:
    no_rdma = dataclasses.replace(P5, efa_rdma=False)

    env = launch.gpu_environment(GPU, no_rdma, efa_in_image=True, kernel_release="6.1")

    assert env["FI_PROVIDER"] == "efa"
    assert "FI_EFA_USE_DEVICE_RDMA" not in env


def test_no_efa_settings_without_libfabric_in_the_image() -> None:
    env = launch.gpu_environment(GPU, P5, efa_in_image=False, kernel_release="6.1")

    assert not {k for k in env if k.startswith("FI_")}


def test_efa_in_the_image_needs_libfabric_and_the_plugin(tmp_path: Path) -> None:
    libfabric, plugin = tmp_path / "efa" / "lib", tmp_path / "aws-ofi-nccl" / "lib"
    libfabric.mkdir(parents=True)

    assert not launch.efa_in_image(libfabric, plugin)
    plugin.mkdir(parents=True)
    assert launch.efa_in_image(libfabric, plugin)
    # The paths Dockerfile.cuda puts on LD_LIBRARY_PATH.
    dockerfile = (Path(__file__).parents[2] / "training_image" / "Dockerfile.cuda").read_text()
    library_path = f"LD_LIBRARY_PATH={launch.OFI_NCCL_DIR}:{launch.EFA_LIBFABRIC_DIR}"
    assert library_path in dockerfile
    # ... and the directory it links the installer's plugin directory to.
    assert f'ln -s "${{dir}}" {launch.OFI_NCCL_DIR}' in dockerfile


def test_the_neuron_stack_checks_do_not_apply_on_a_gpu_node() -> None:
    # TorchNeuron (the default stack) on trn1 is refused on a trn node ...
    trn1 = {"TRN_INSTANCE_TYPE": "trn1.32xlarge"}
    assert launch.node_problem(trn1) is not None
    # ... and not looked at on a GPU node.
    assert launch.node_problem({**trn1, **GPU}) is None


@pytest.mark.parametrize(
    ("env", "match"),
    [
        (
            {"TRN_GPU_INSTANCE_TYPE": "p4d.24xlarge"},
            r"^instance type 'p4d\.24xlarge' is not in the GPU instance catalog; known: "
            r"p5\.48xlarge, ",
        ),
        (
            {**GPU, "NEURON_STACK": "native"},
            r"^this image has the Neuron stack NEURON_STACK=native but runs on the GPU node "
            r"p5\.48xlarge: use the CUDA image \(the environment's gpu_image_uri",
        ),
    ],
    ids=["unknown-gpu-type", "neuron-image"],
)
def test_an_image_that_cannot_run_on_the_gpu_node_is_refused(
    env: dict[str, str], match: str
) -> None:
    problem = launch.node_problem(env)

    assert problem is not None
    with pytest.raises(ValueError, match=match):
        launch.node_environment(env)


# --- the entrypoint as a process --------------------------------------------------------------

# A stand-in torchrun: records its argv and the environment it got, exits 0.
FAKE_TORCHRUN = """#!{python}
import json, os, sys
from pathlib import Path
Path(os.environ["RECORD"]).write_text(json.dumps({{"argv": sys.argv[1:], "env": dict(os.environ)}}))
"""
SHOW_ENV = "import json, os; print(json.dumps(dict(os.environ)))"


def gpu_node_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A GPU pod's environment as the cuda-torch runtime and a TrainJob set it, on this CPU
    machine; the Neuron caches pointed at ``tmp_path`` so that their creation would show."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    for name in (*NEURON_VARIABLES, "NEURON_STACK", "TRN_INSTANCE_TYPE", "FI_PROVIDER"):
        env.pop(name, None)
    env.update(
        GPU,
        **RENDEZVOUS,
        PET_NPROC_PER_NODE="8",
        TRN_NEFF_CACHE_BASE=str(tmp_path / "neff"),
        TRN_CHECKPOINT_DIR=str(tmp_path / "fsx" / "checkpoints" / "run-p5"),
        OMP_NUM_THREADS="1",
        **extra,
    )
    return env


def run_entrypoint(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ENTRYPOINT), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_command_on_a_gpu_node_gets_no_neuron_environment(tmp_path: Path) -> None:
    done = run_entrypoint(
        "--exec", "--", sys.executable, "-c", SHOW_ENV, env=gpu_node_env(tmp_path)
    )

    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert not set(NEURON_VARIABLES) - {"TRN_NEFF_CACHE_BASE"} & set(seen)
    assert not (tmp_path / "neff").exists()  # no compile cache created
    assert "compile cache:" not in done.stderr
    assert "launch: p5.48xlarge: 8 ranks per node on cuda; " in done.stderr
    # Kubeflow's rendezvous under the plain names too, as on a trn node.
    assert (seen["NNODES"], seen["NODE_RANK"], seen["MASTER_PORT"]) == ("2", "1", "29400")
    assert Path(seen["TRN_CHECKPOINT_DIR"]).is_dir()
    if not launch.efa_in_image():  # this machine: no libfabric, so no EFA settings
        assert "NCCL falls back to TCP sockets" in done.stderr
        assert not {k for k in seen if k.startswith("FI_")}


def test_the_trainer_on_a_gpu_node_starts_torchrun_with_a_rank_per_gpu_on_cuda(
    tmp_path: Path,
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    torchrun = bin_dir / "torchrun"
    torchrun.write_text(FAKE_TORCHRUN.format(python=sys.executable))
    torchrun.chmod(0o755)
    record = tmp_path / "torchrun.json"
    env = gpu_node_env(tmp_path, RECORD=str(record), PATH=f"{bin_dir}:{os.environ['PATH']}")

    done = run_entrypoint("--preset", "tiny", "--data", "/datasets/d", env=env)

    assert done.returncode == 0, done.stderr
    ran = json.loads(record.read_text())
    argv = ran["argv"]
    assert argv[:5] == [
        "--nproc-per-node=8",
        "--nnodes=2",
        "--node-rank=1",
        "--master-addr=run-p5-node-0-0.run-p5",
        "--master-port=29400",
    ]
    start = argv.index("-m")
    assert argv[start:] == [
        *["-m", "trainer", "run", "--instance-type", "p5.48xlarge", "--device", "cuda"],
        *["--preset", "tiny", "--data", "/datasets/d"],
    ]
    assert not set(NEURON_VARIABLES) - {"TRN_NEFF_CACHE_BASE"} & set(ran["env"])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"TRN_PRECOMPILE": "1"},
            "error: TRN_PRECOMPILE=1 fills the Neuron compile cache; a GPU node has none",
        ),
        ({"NEURON_STACK": "native"}, "error: this image has the Neuron stack NEURON_STACK=native"),
    ],
    ids=["precompile", "neuron-image"],
)
def test_the_entrypoint_refuses_what_a_gpu_node_cannot_run(
    tmp_path: Path, extra: dict[str, str], message: str
) -> None:
    env = gpu_node_env(tmp_path, PATH="/nonexistent", **extra)  # no torchrun may start

    done = run_entrypoint("--preset", "tiny", "--data", "d", env=env)

    assert done.returncode == 2
    assert message in done.stderr
