"""The container entrypoint's logic: the job environment and the torchrun command lines.

Pure functions of the incoming environment, so that they are tested without a container. The
facts behind each variable are in the platform notes (Neuron SDK docs: runtime and compiler
environment variables, EFA setup for multi-node training).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import shlex
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from types import FrameType

DEFAULT_CACHE = "/var/tmp/neuron-compile-cache"  # neuronx-cc's own default
# --auto-cast=none: the trainer casts with torch.autocast, so the compiler must not cast again.
DEFAULT_CC_FLAGS = "--model-type transformer --auto-cast=none"
PRECOMPILE_STEPS = 2  # the warm-up graph and the steady-state one


def compiler_version() -> str:
    """The installed neuronx-cc version, or ``none`` where it is not installed (CPU, CUDA)."""
    try:
        return importlib.metadata.version("neuronx-cc")
    except importlib.metadata.PackageNotFoundError:
        return "none"


def compile_cache_url(base: str, *, compiler: str, cc_flags: str) -> str:
    """``base/neuronx-cc-<version>/<hash of the flags>``: a compiled graph is only reused by the
    same compiler with the same flags, so jobs that differ in either never share (and never
    poison) a cache entry. Flags are compared token by token, so spacing does not matter."""
    flags = " ".join(shlex.split(cc_flags))
    digest = hashlib.sha256(flags.encode()).hexdigest()[:16]
    return f"{base.rstrip('/')}/neuronx-cc-{compiler}/flags-{digest}"


def _kernel_older_than(release: str, major: int, minor: int) -> bool:
    parts = release.split(".")
    try:
        return (int(parts[0]), int(parts[1].split("-")[0])) < (major, minor)
    except (IndexError, ValueError):
        return False


def job_environment(
    environ: Mapping[str, str], *, compiler: str, kernel_release: str | None = None
) -> dict[str, str]:
    """The environment for torchrun and its workers.

    Sets (keeping any value the job already set): ``FI_PROVIDER=efa`` and
    ``FI_EFA_USE_DEVICE_RDMA=1`` so collectives use EFA with device RDMA rather than silently
    falling back to TCP; ``FI_EFA_FORK_SAFE=1`` only on kernels older than 5.15;
    ``NEURON_CC_FLAGS`` (default :data:`DEFAULT_CC_FLAGS`); ``MALLOC_ARENA_MAX=64``; and, with
    several nodes, ``NEURON_RT_ROOT_COMM_ID=<MASTER_ADDR>:<MASTER_PORT + 1>``. Always rewrites
    ``NEURON_COMPILE_CACHE_URL`` (default base :data:`DEFAULT_CACHE`, or an ``s3://`` URI) to the
    key of :func:`compile_cache_url`.
    """
    env = dict(environ)
    # Kubeflow Trainer's torch runtime announces the rendezvous as PET_* (torchrun's own
    # environment prefix); take those where the plain names are not set.
    for name in ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "NPROC_PER_NODE"):
        if f"PET_{name}" in env:
            env.setdefault(name, env[f"PET_{name}"])
    env.setdefault("FI_PROVIDER", "efa")
    env.setdefault("FI_EFA_USE_DEVICE_RDMA", "1")
    if _kernel_older_than(kernel_release or platform.release(), 5, 15):
        env.setdefault("FI_EFA_FORK_SAFE", "1")
    env.setdefault("NEURON_CC_FLAGS", DEFAULT_CC_FLAGS)
    env.setdefault("MALLOC_ARENA_MAX", "64")
    if int(env.get("NNODES", "1")) > 1:
        port = int(env.get("MASTER_PORT", "29500")) + 1
        env.setdefault("NEURON_RT_ROOT_COMM_ID", f"{env['MASTER_ADDR']}:{port}")
    base = (
        env.get("NEURON_COMPILE_CACHE_BASE") or env.get("NEURON_COMPILE_CACHE_URL") or DEFAULT_CACHE
    )
    env["NEURON_COMPILE_CACHE_BASE"] = base
    env["NEURON_COMPILE_CACHE_URL"] = compile_cache_url(
        base, compiler=compiler, cc_flags=env["NEURON_CC_FLAGS"]
    )
    return env


def ranks_per_node(env: Mapping[str, str]) -> int:
    """``NPROC_PER_NODE`` if set, else one rank per logical NeuronCore of ``TRN_INSTANCE_TYPE``
    (default trn3.48xlarge; the logical core size ``NEURON_LOGICAL_NC_CONFIG`` defaults to 2 on
    Trn2/Trn3, 1 on Trn1)."""
    if "NPROC_PER_NODE" in env:
        return int(env["NPROC_PER_NODE"])
    import trn_catalog

    spec = trn_catalog.get(env.get("TRN_INSTANCE_TYPE", "trn3.48xlarge"))
    lnc = int(env.get("NEURON_LOGICAL_NC_CONFIG", str(spec.default_lnc)))
    return spec.neuron_cores // lnc


def torchrun_argv(env: Mapping[str, str], train_args: Sequence[str]) -> list[str]:
    """``torchrun`` for this node: standalone for one node, else a static rendezvous at
    ``MASTER_ADDR:MASTER_PORT`` with ``NNODES`` nodes and this node's ``NODE_RANK``."""
    nnodes = int(env.get("NNODES", "1"))
    argv = ["torchrun", f"--nproc-per-node={ranks_per_node(env)}"]
    if nnodes == 1:
        argv.append("--standalone")
    else:
        argv += [
            f"--nnodes={nnodes}",
            f"--node-rank={env['NODE_RANK']}",
            f"--master-addr={env['MASTER_ADDR']}",
            f"--master-port={env.get('MASTER_PORT', '29500')}",
        ]
    instance = env.get("TRN_INSTANCE_TYPE", "trn3.48xlarge")
    return [*argv, "-m", "trainer", "run", "--instance-type", instance, *train_args]


def precompile_argv(env: Mapping[str, str], train_args: Sequence[str]) -> list[str]:
    """A short pass that only fills the compile cache: the same job for :data:`PRECOMPILE_STEPS`
    steps without checkpoints or metrics (later flags win in argparse). The PyTorch/XLA stack
    wraps it in ``neuron_parallel_compile``, which extracts and compiles the graphs in parallel."""
    overrides = [
        "--max-steps",
        str(PRECOMPILE_STEPS),
        "--checkpoint-dir",
        "",
        "--checkpoint-every",
        "0",
        "--metrics",
        "",
    ]
    argv = torchrun_argv(env, [*train_args, *overrides])
    return ["neuron_parallel_compile", *argv] if env.get("NEURON_STACK") == "xla" else argv


def _run_forwarding_sigterm(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Runs ``argv``, passing SIGTERM on. The workers answer SIGTERM by writing a checkpoint and
    exiting 0, but torchrun reports any signal as a failure (exit 1); a preemption that ends
    with the child gone is therefore reported as success, so that the job is not retried as
    failed."""
    child = subprocess.Popen(list(argv), env=dict(env))
    terminated = False

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal terminated
        terminated = True
        child.send_signal(signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        code = child.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0 if terminated else code


def main(argv: Sequence[str] | None = None) -> int:
    """The image's entrypoint: ``entrypoint.py [trainer run flags...]``. With
    ``TRN_PRECOMPILE=1`` it first runs :func:`precompile_argv`; a failing pre-pass stops the
    job with its exit status."""
    train_args = list(sys.argv[1:] if argv is None else argv)
    env = job_environment(os.environ, compiler=compiler_version())
    print(f"compile cache: {env['NEURON_COMPILE_CACHE_URL']}", file=sys.stderr)
    if env.get("TRN_PRECOMPILE") == "1":
        code = subprocess.run(precompile_argv(env, train_args), env=env, check=False).returncode
        if code:
            return code
    return _run_forwarding_sigterm(torchrun_argv(env, train_args), env)
