"""The container entrypoint's logic: the job environment and the torchrun command lines.

Mostly pure functions of the incoming environment, so that they are tested without a
container. The facts behind each variable are in the platform notes (Neuron SDK docs: runtime and
compiler environment variables, EFA setup for multi-node training) and in :mod:`trainer.stacks`.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import shlex
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

from trainer import stacks

# The instance type a job's environment names in TRN_INSTANCE_TYPE, where it names none.
DEFAULT_INSTANCE_TYPE = "trn3.48xlarge"
PRECOMPILE_STEPS = 2  # the warm-up graph and the steady-state one
PRECOMPILE_ENV = "TRN_PRECOMPILE"  # "1": run trn-train compile before the run
# torchrun's own wait between the SIGTERM and the SIGKILL of its workers, where the job sets none.
DEFAULT_SHUTDOWN_TIMEOUT_S = 30
# Exit status after a SIGTERM (the shell's 128 + 15): the run was interrupted, not finished.
PREEMPTED_EXIT = 128 + signal.SIGTERM


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
    ``NEURON_CC_FLAGS`` (default: the stack's, see :mod:`trainer.stacks`);
    ``MALLOC_ARENA_MAX=64``. Leaves ``NEURON_RT_ROOT_COMM_ID`` (the Neuron runtime's collectives
    bootstrap address) to the framework unless the job sets it: TorchNeuron's process group has
    rank 0 pick a free port on ``MASTER_ADDR`` and share it through torch.distributed's store,
    and the PyTorch/XLA Neuron plugin uses ``MASTER_ADDR`` with its own fixed port, whereas a
    port guessed from ``MASTER_PORT`` can be taken. Always rewrites the compile cache
    variable of the image's stack (``TORCH_NEURONX_NEFF_CACHE_DIR`` for native,
    ``NEURON_COMPILE_CACHE_URL`` for xla; base: the job's value or the stack's default) to the
    key of :func:`compile_cache_url`, keeping the base in the stack's base variable.

    Raises:
        ValueError: an unknown ``NEURON_STACK``.
    """
    env = dict(environ)
    stack = stacks.of(env)
    # Kubeflow Trainer's torch runtime announces the rendezvous as PET_* (torchrun's own
    # environment prefix); take those where the plain names are not set.
    for name in ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "NPROC_PER_NODE"):
        if f"PET_{name}" in env:
            env.setdefault(name, env[f"PET_{name}"])
    env.setdefault("FI_PROVIDER", "efa")
    env.setdefault("FI_EFA_USE_DEVICE_RDMA", "1")
    if _kernel_older_than(kernel_release or platform.release(), 5, 15):
        env.setdefault("FI_EFA_FORK_SAFE", "1")
    env.setdefault("NEURON_CC_FLAGS", stack.cc_flags)
    env.setdefault("MALLOC_ARENA_MAX", "64")
    base = (
        env.get(stack.cache_base_variable) or env.get(stack.cache_variable) or stack.default_cache
    )
    env[stack.cache_base_variable] = base
    env[stack.cache_variable] = compile_cache_url(
        base, compiler=compiler, cc_flags=env["NEURON_CC_FLAGS"]
    )
    return env


def stack_problem(env: Mapping[str, str]) -> str | None:
    """Why the image's stack cannot train on ``TRN_INSTANCE_TYPE``, or None: an unknown
    ``NEURON_STACK``, or TorchNeuron (native) on Trainium1, which only the xla stack supports."""
    try:
        stack = stacks.of(env)
        stacks.check_instance(stack, env.get("TRN_INSTANCE_TYPE", DEFAULT_INSTANCE_TYPE))
    except (ValueError, KeyError) as error:  # KeyError: trn_catalog.UnknownInstanceTypeError
        return str(error)
    return None


def prepare_cache(env: Mapping[str, str]) -> None:
    """Creates the native stack's NEFF cache directory (on FSx in a job) if it is missing; the
    XLA stack's cache may be an ``s3://`` URI and its compiler creates its own."""
    stack = stacks.of(env)
    if stack.name == "native":
        Path(env[stack.cache_variable]).mkdir(parents=True, exist_ok=True)


def ranks_per_node(env: Mapping[str, str]) -> int:
    """One rank per logical NeuronCore of ``TRN_INSTANCE_TYPE`` from the instance catalog (the
    logical core size ``NEURON_LOGICAL_NC_CONFIG`` defaults to 2 on Trn2/Trn3, 1 on Trn1).

    In a job the catalog wins over ``NPROC_PER_NODE`` / ``PET_NPROC_PER_NODE``: Kubeflow Trainer
    2.3.0 sets the latter to the pod's CPU request (184 on trn2.48xlarge) when the TrainJob names
    no ``numProcPerNode``, or to ``auto`` with GPUs. A contradicting value is overridden with a
    note on stderr. Without ``TRN_INSTANCE_TYPE`` (a run outside the platform, on CPU) a whole
    ``NPROC_PER_NODE`` is taken as it is; anything else falls back to the catalog's count for
    trn3.48xlarge, again with a note.

    Raises:
        ValueError: ``NEURON_LOGICAL_NC_CONFIG`` does not divide the type's NeuronCores.
        KeyError: ``TRN_INSTANCE_TYPE`` is not in the catalog
            (``trn_catalog.UnknownInstanceTypeError``).
    """
    variable = "NPROC_PER_NODE" if "NPROC_PER_NODE" in env else "PET_NPROC_PER_NODE"
    given = env.get(variable)
    if "TRN_INSTANCE_TYPE" not in env and given is not None and given.isdigit() and int(given):
        return int(given)
    import trn_catalog

    spec = trn_catalog.get(env.get("TRN_INSTANCE_TYPE", DEFAULT_INSTANCE_TYPE))
    lnc_text = env.get("NEURON_LOGICAL_NC_CONFIG", str(spec.default_lnc))
    if not (lnc_text.isdigit() and int(lnc_text) and spec.neuron_cores % int(lnc_text) == 0):
        raise ValueError(
            f"NEURON_LOGICAL_NC_CONFIG {lnc_text!r} does not divide the {spec.neuron_cores} "
            f"NeuronCores of {spec.name}; use 1 or 2"
        )
    ranks = spec.neuron_cores // int(lnc_text)
    if given is not None and given != str(ranks):
        print(
            f"launch: {spec.name} has {ranks} logical NeuronCores (NEURON_LOGICAL_NC_CONFIG="
            f"{lnc_text}); running {ranks} ranks per node, not {variable}={given}",
            file=sys.stderr,
        )
    return ranks


def torchrun_prefix(env: Mapping[str, str], *, shutdown_flag: bool = False) -> list[str]:
    """``torchrun`` for this node, up to the program it runs: standalone for one node, else a
    static rendezvous at ``MASTER_ADDR:MASTER_PORT`` with ``NNODES`` nodes and this node's
    ``NODE_RANK``.

    With ``shutdown_flag`` (only where torchrun has it: :func:`torchrun_takes_shutdown_timeout`),
    ``--shutdown-timeout`` gives workers that torchrun stops itself ``TRN_SHUTDOWN_TIMEOUT_S``
    (set by the workspace from the pod's grace period, less a margin) between SIGTERM and
    SIGKILL instead of 30 s."""
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
    if shutdown_flag:
        timeout = int(env.get("TRN_SHUTDOWN_TIMEOUT_S", DEFAULT_SHUTDOWN_TIMEOUT_S))
        argv.append(f"--shutdown-timeout={timeout}")
    return argv


def stack_device_args(env: Mapping[str, str]) -> list[str]:
    """``--device <the stack's device>`` where the image names its stack (``NEURON_STACK``),
    so that a missing Neuron device is an error rather than a run on CPU; else nothing (auto)."""
    return ["--device", stacks.of(env).device] if "NEURON_STACK" in env else []


def torchrun_argv(
    env: Mapping[str, str],
    train_args: Sequence[str],
    *,
    shutdown_flag: bool = False,
    command: str = "run",
) -> list[str]:
    """:func:`torchrun_prefix` running ``trn-train <command>`` (default ``run``) on
    ``TRN_INSTANCE_TYPE`` with the stack's device (:func:`stack_device_args`); ``train_args``
    come last and win."""
    instance = env.get("TRN_INSTANCE_TYPE", DEFAULT_INSTANCE_TYPE)
    return [
        *torchrun_prefix(env, shutdown_flag=shutdown_flag),
        *["-m", "trainer", command, "--instance-type", instance],
        *stack_device_args(env),
        *train_args,
    ]


def torchrun_takes_shutdown_timeout() -> bool:
    """Whether the installed torchrun has ``--shutdown-timeout`` (PyTorch PR 172596, 2026; the
    XLA image's torch 2.9 lacks it and would refuse the flag). Read from torchrun's source, so
    that the entrypoint, which lives as long as the job, never imports torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    run = Path(next(iter(spec.submodule_search_locations))) / "distributed" / "run.py"
    return run.is_file() and "--shutdown-timeout" in run.read_text(encoding="utf-8")


def precompile_argv(env: Mapping[str, str], train_args: Sequence[str]) -> list[str]:
    """A short pass that only fills the compile cache: ``trn-train compile`` with the run's own
    flags (the same job for :data:`PRECOMPILE_STEPS` steps without checkpoints or metrics,
    after a check of the node's host memory). The PyTorch/XLA stack wraps it in
    ``neuron_parallel_compile``, which extracts the graphs from that trial run and compiles them
    in parallel; on TorchNeuron the ranks compile as they meet each graph. Either way it runs on
    the trn node: neither stack documents compiling these graphs without Neuron devices."""
    argv = torchrun_argv(env, train_args, command="compile")
    return ["neuron_parallel_compile", *argv] if env.get("NEURON_STACK") == "xla" else argv


def worker_pids(parent: int, proc: Path = Path("/proc")) -> list[int]:
    """The processes whose parent is ``parent`` (torchrun's workers), from ``/proc``."""
    pids = []
    for stat in proc.glob("[0-9]*/stat"):
        try:
            # The command name may hold spaces and parentheses: the fields follow the last ")".
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone since the listing
        if int(fields[1]) == parent:
            pids.append(int(stat.parent.name))
    return pids


def exit_status(code: int, *, terminated: bool) -> int:
    """The entrypoint's exit status: torchrun's when non-zero (a child killed by a signal reads
    as the shell's 128 + signal); else :data:`PREEMPTED_EXIT` after a SIGTERM, else 0. A SIGTERM
    means a preemption, a drain or the end of a Capacity Block: even when every worker wrote its
    checkpoint and exited 0 the run is unfinished, so the pod fails and the job is retried or
    reported as interrupted, never marked Succeeded; a resubmitted job resumes from that
    checkpoint."""
    if code < 0:
        code = 128 - code
    return code or (PREEMPTED_EXIT if terminated else 0)


def _run_forwarding_sigterm(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Runs torchrun ``argv`` and returns :func:`exit_status`. A SIGTERM goes to torchrun's
    workers (its children), not to torchrun: signalled itself, torchrun gives the workers only
    its shutdown timeout (a fixed 30 s in torch releases without ``--shutdown-timeout``, such as
    the XLA image's 2.9) and then exits 1 whatever they did. Signalled directly, the workers
    agree on a stop, write a checkpoint and exit 0, and torchrun exits with their status.
    Before torchrun has started its workers the signal goes to torchrun."""
    child = subprocess.Popen(list(argv), env=dict(env))
    terminated = False

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal terminated
        terminated = True
        for pid in worker_pids(child.pid) or [child.pid]:
            with contextlib.suppress(ProcessLookupError):  # exited since the listing
                os.kill(pid, signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        code = child.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return exit_status(code, terminated=terminated)


def main(argv: Sequence[str] | None = None) -> int:
    """The image's entrypoint: ``entrypoint.py [trainer run flags...]``. Refuses a stack that
    cannot run on this instance type (exit 2). With ``TRN_PRECOMPILE=1`` (``trnctl job submit
    --precompile``) it first runs :func:`precompile_argv`; a failing pre-pass (too little host
    memory for the compilers, say) stops the job with its exit status."""
    train_args = list(sys.argv[1:] if argv is None else argv)
    problem = stack_problem(os.environ)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    env = job_environment(os.environ, compiler=compiler_version())
    prepare_cache(env)
    stack = stacks.of(env)
    print(f"compile cache: {stack.cache_variable}={env[stack.cache_variable]}", file=sys.stderr)
    if env.get(PRECOMPILE_ENV) == "1":
        code = subprocess.run(precompile_argv(env, train_args), env=env, check=False).returncode
        if code:
            return code
    argv = torchrun_argv(env, train_args, shutdown_flag=torchrun_takes_shutdown_timeout())
    return _run_forwarding_sigterm(argv, env)
