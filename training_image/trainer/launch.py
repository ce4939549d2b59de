"""The container entrypoint's logic: the job environment and the torchrun command lines.

Mostly pure functions of the incoming environment, so that they are tested without a
container. The facts behind each variable are in the platform notes (Neuron SDK docs: runtime and
compiler environment variables, EFA setup for multi-node training) and in :mod:`trainer.stacks`.

Two kinds of node: a trn node of the ``neuron-torch`` runtime (``TRN_INSTANCE_TYPE``, the
image's Neuron stack), and a GPU node of the ``cuda-torch`` runtime, which names its type in
``TRN_GPU_INSTANCE_TYPE`` (the CUDA image, ``training_image/Dockerfile.cuda``): one rank per GPU
of the GPU catalog, device ``cuda``, NCCL over EFA through the image's aws-ofi-nccl, and none of
the Neuron stack's checks, compiler flags or compile cache.
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
from trn_catalog.gpu_instances import GpuInstanceSpec
from trn_catalog.workspace import GPU_INSTANCE_TYPE_ENV

# Where the CUDA image has libfabric (the EFA installer's) and the aws-ofi-nccl plugin that carries
# NCCL over it (Dockerfile.cuda links the plugin's directory, wherever the installer put it, and
# puts both on LD_LIBRARY_PATH; without them NCCL uses sockets).
EFA_LIBFABRIC_DIR = Path("/opt/amazon/efa/lib")
OFI_NCCL_DIR = Path("/opt/ofi-nccl")
# aws-ofi-nccl's name for its NCCL net plugin (v1.21.1 src/nccl_ofi_interface_nvidia.cpp).
# Named in NCCL_NET, NCCL uses that plugin or fails; unnamed, NCCL (2.30 src/plugin/net.cc)
# takes its built-in sockets when the plugin does not start, without an error.
NCCL_EFA_NET = "Libfabric"
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


# The Neuron runtime's logical NeuronCore size, and the compiler option that must agree with it
# (Neuron docs, Logical NeuronCore configuration: `--logical-nc-config` or `-lnc`; `--lnc` in
# the compiler's error pages).
LNC_VARIABLE = "NEURON_LOGICAL_NC_CONFIG"
LNC_FLAG = "--logical-nc-config"
_LNC_OPTIONS = ("--logical-nc-config", "-lnc", "--lnc")


def with_lnc_flag(cc_flags: str, lnc: str | None) -> str:
    """``cc_flags`` with the compiler's LNC option set to ``lnc`` (the runtime's
    ``NEURON_LOGICAL_NC_CONFIG``): appended when the flags have none; unchanged when they
    already name ``lnc`` or when ``lnc`` is None.

    Raises:
        ValueError: the flags name another LNC (Neuron does not support a compiler LNC other
            than the runtime's).
    """
    if lnc is None:
        return cc_flags
    words = shlex.split(cc_flags)
    for index, word in enumerate(words):
        option, equals, value = word.partition("=")
        if option not in _LNC_OPTIONS:
            continue
        if not equals:
            value = words[index + 1] if index + 1 < len(words) else ""
        if value != lnc:
            raise ValueError(
                f"NEURON_CC_FLAGS sets {option} {value} but {LNC_VARIABLE} is {lnc}: the "
                "compiler's logical NeuronCore size must be the runtime's; drop the flag or "
                "make them agree"
            )
        return cc_flags
    return f"{cc_flags} {LNC_FLAG}={lnc}".strip()


def check_cache_flags(stack: stacks.NeuronStack, cc_flags: str) -> None:
    """Refuses ``--cache_dir`` in the XLA stack's ``NEURON_CC_FLAGS``: Neuron's compiler
    wrapper takes it over ``NEURON_COMPILE_CACHE_URL`` (Neuron 2.29.1 docs, "Neuron
    Persistent Cache"), so the job would compile into its own directory and not the shared,
    version-keyed cache the launcher sets.

    Raises:
        ValueError: naming the flag and the variable to set instead.
    """
    if stack.name != "xla":
        return
    for word in shlex.split(cc_flags):
        option, _, value = word.partition("=")
        if option == "--cache_dir":
            raise ValueError(
                f"NEURON_CC_FLAGS sets --cache_dir{'=' + value if value else ''}, which the "
                f"Neuron compiler wrapper puts before {stack.cache_variable}: the job would "
                "miss the platform's shared compile cache; drop the flag (to move the cache, "
                f"set {stack.cache_variable}, which the launcher keys by compiler and flags)"
            )


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
    ``NEURON_CC_FLAGS`` (default: the stack's, see :mod:`trainer.stacks`), with
    ``--logical-nc-config=<n>`` added when ``NEURON_LOGICAL_NC_CONFIG`` is set (the compiler's
    LNC must be the runtime's, :func:`with_lnc_flag`); ``MALLOC_ARENA_MAX=64``. Leaves
    ``NEURON_RT_ROOT_COMM_ID`` (the Neuron runtime's collectives bootstrap address) to the
    framework unless the job sets it: TorchNeuron's process group has
    rank 0 pick a free port on ``MASTER_ADDR`` and share it through torch.distributed's store,
    and the PyTorch/XLA Neuron plugin uses ``MASTER_ADDR`` with its own fixed port, whereas a
    port guessed from ``MASTER_PORT`` can be taken. Always rewrites the compile cache
    variable of the image's stack (``TORCH_NEURONX_NEFF_CACHE_DIR`` for native,
    ``NEURON_COMPILE_CACHE_URL`` for xla; base: the job's value or the stack's default) to the
    key of :func:`compile_cache_url`, keeping the base in the stack's base variable.

    Raises:
        ValueError: an unknown ``NEURON_STACK``, ``NEURON_CC_FLAGS`` naming another LNC than
            ``NEURON_LOGICAL_NC_CONFIG``, or (xla) a ``--cache_dir`` (:func:`check_cache_flags`).
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
    env["NEURON_CC_FLAGS"] = with_lnc_flag(env["NEURON_CC_FLAGS"], env.get(LNC_VARIABLE))
    check_cache_flags(stack, env["NEURON_CC_FLAGS"])
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
    ``NEURON_STACK``, TorchNeuron (native) on Trainium1, which only the xla stack supports, or
    an image (``NEURON_STACK`` set) that is not told its node's type: a guess would let the
    native stack start on Trainium1 and count another type's ranks. Outside an image with no
    type named there is nothing to check."""
    if "TRN_INSTANCE_TYPE" not in env and "NEURON_STACK" not in env:
        return None
    try:
        stack = stacks.of(env)
        stacks.check_instance(stack, env.get("TRN_INSTANCE_TYPE", ""))
    except (ValueError, KeyError) as error:  # KeyError: trn_catalog.UnknownInstanceTypeError
        return str(error)
    return None


def gpu_spec(env: Mapping[str, str]) -> GpuInstanceSpec | None:
    """The GPU catalog's entry for ``TRN_GPU_INSTANCE_TYPE`` (a GPU node), or None (a trn node,
    or a run outside the platform).

    Raises:
        KeyError: the type is not in the GPU catalog (``UnknownGpuInstanceTypeError``).
    """
    name = env.get(GPU_INSTANCE_TYPE_ENV)
    if not name:
        return None
    from trn_catalog.gpu_instances import get_gpu

    return get_gpu(name)


def gpu_problem(env: Mapping[str, str]) -> str | None:
    """Why this image cannot train on the GPU node ``env`` names, or None: a GPU type outside
    the GPU catalog, or an image with a Neuron stack (``NEURON_STACK``: the Neuron image, whose
    torch has no CUDA)."""
    try:
        spec = gpu_spec(env)
    except KeyError as error:  # trn_catalog.UnknownGpuInstanceTypeError
        return str(error)
    if spec is not None and "NEURON_STACK" in env:
        return (
            f"this image has the Neuron stack NEURON_STACK={env['NEURON_STACK']} but runs on the "
            f"GPU node {spec.name}: use the CUDA image (the environment's gpu_image_uri, "
            "training_image/Dockerfile.cuda), or an image built from it"
        )
    return None


def gpu_environment(
    environ: Mapping[str, str],
    spec: GpuInstanceSpec,
    *,
    efa_in_image: bool,
    kernel_release: str | None = None,
) -> dict[str, str]:
    """The environment for torchrun and its workers on a GPU node of ``spec``.

    Takes the rendezvous from Kubeflow's ``PET_*`` as :func:`job_environment` does. Where the
    image has libfabric and aws-ofi-nccl (``efa_in_image``), sets (keeping any value the job
    set) libfabric's EFA provider for NCCL's plugin, ``FI_EFA_USE_DEVICE_RDMA=1`` only on types
    whose EFA supports RDMA (GPUDirect RDMA; the catalog's ``efa_rdma``) and
    ``FI_EFA_FORK_SAFE=1`` on kernels older than 5.15 (settings older aws-ofi-nccl releases
    needed; its v1.21.1 docs call the RDMA one harmless on p4/p5 and the fork-safe one no longer
    needed), and across nodes ``NCCL_NET`` = :data:`NCCL_EFA_NET`, so that
    a plugin that cannot start stops the run instead of leaving a GPU comparison on TCP
    sockets. No Neuron compiler flags or compile cache."""
    env = dict(environ)
    for name in ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "NPROC_PER_NODE"):
        if f"PET_{name}" in env:
            env.setdefault(name, env[f"PET_{name}"])
    if efa_in_image:
        env.setdefault("FI_PROVIDER", "efa")
        if spec.efa_rdma:
            env.setdefault("FI_EFA_USE_DEVICE_RDMA", "1")
        if _kernel_older_than(kernel_release or platform.release(), 5, 15):
            env.setdefault("FI_EFA_FORK_SAFE", "1")
        if env.get("NNODES", "1") != "1":
            env.setdefault("NCCL_NET", NCCL_EFA_NET)
    return env


def efa_in_image(libfabric: Path = EFA_LIBFABRIC_DIR, plugin: Path = OFI_NCCL_DIR) -> bool:
    """Whether the image has libfabric and the aws-ofi-nccl plugin, NCCL's way onto EFA."""
    return libfabric.is_dir() and plugin.is_dir()


def node_problem(env: Mapping[str, str]) -> str | None:
    """Why the image cannot run on this node, or None: :func:`gpu_problem` on a GPU node, else
    :func:`stack_problem`."""
    if env.get(GPU_INSTANCE_TYPE_ENV):
        return gpu_problem(env)
    return stack_problem(env)


def node_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The checked environment of this node, for the trainer or a ``--exec`` command: on a GPU
    node :func:`gpu_environment`, else :func:`job_environment` with the stack's compile cache
    created. Notes on stderr say which (the compile cache, or the GPU type, ranks and whether
    NCCL can use EFA).

    Raises:
        ValueError: why the image cannot run on this node (:func:`node_problem`), or compiler
            flags that contradict it (:func:`job_environment`).
    """
    problem = node_problem(environ)
    if problem:
        raise ValueError(problem)
    spec = gpu_spec(environ)
    if spec is not None:
        efa = efa_in_image()
        env = gpu_environment(environ, spec, efa_in_image=efa)
        print(f"launch: {gpu_note(spec, efa=efa)}", file=sys.stderr)
        return env
    env = job_environment(environ, compiler=compiler_version())
    prepare_cache(env)
    stack = stacks.of(env)
    print(f"compile cache: {stack.cache_variable}={env[stack.cache_variable]}", file=sys.stderr)
    return env


def gpu_note(spec: GpuInstanceSpec, *, efa: bool) -> str:
    """One line about a GPU node: its type, ranks, device and how NCCL reaches the other
    nodes."""
    network = (
        f"NCCL over EFA ({spec.efa_interfaces} interfaces) through aws-ofi-nccl"
        if efa
        else f"no libfabric/aws-ofi-nccl under {EFA_LIBFABRIC_DIR.parent} in this image: NCCL "
        "falls back to TCP sockets between nodes"
    )
    return f"{spec.name}: {spec.gpus} ranks per node on cuda; {network}"


def prepare_cache(env: Mapping[str, str]) -> None:
    """Creates the native stack's NEFF cache directory (on FSx in a job) if it is missing; the
    XLA stack's cache may be an ``s3://`` URI and its compiler creates its own."""
    stack = stacks.of(env)
    if stack.name == "native":
        Path(env[stack.cache_variable]).mkdir(parents=True, exist_ok=True)


def ranks_per_node(env: Mapping[str, str]) -> int:
    """One rank per logical NeuronCore of ``TRN_INSTANCE_TYPE`` from the instance catalog (the
    logical core size ``NEURON_LOGICAL_NC_CONFIG`` defaults to 2 on Trn2/Trn3, 1 on Trn1); on a
    GPU node (:func:`gpu_spec`) one rank per GPU of the GPU catalog, whatever
    ``NPROC_PER_NODE`` says (with a note when it differs).

    In a job the catalog wins over ``NPROC_PER_NODE`` / ``PET_NPROC_PER_NODE``: Kubeflow Trainer
    2.3.0 sets the latter to the pod's CPU request (184 on trn2.48xlarge) when the TrainJob names
    no ``numProcPerNode``, or to ``auto`` with GPUs. A contradicting value is overridden with a
    note on stderr. Without ``TRN_INSTANCE_TYPE`` (a run outside the platform, on CPU) a whole
    ``NPROC_PER_NODE`` is taken as it is, and none means one rank (torchrun's default).

    Raises:
        ValueError: ``NEURON_LOGICAL_NC_CONFIG`` does not divide the type's NeuronCores, or,
            without ``TRN_INSTANCE_TYPE``, the rank count is not a whole number (``auto``).
        KeyError: ``TRN_INSTANCE_TYPE`` (or ``TRN_GPU_INSTANCE_TYPE``) is not in its catalog
            (``trn_catalog.UnknownInstanceTypeError``).
    """
    variable = "NPROC_PER_NODE" if "NPROC_PER_NODE" in env else "PET_NPROC_PER_NODE"
    given = env.get(variable)
    gpu = gpu_spec(env)
    if gpu is not None:
        if given is not None and given != str(gpu.gpus):
            print(
                f"launch: {gpu.name} has {gpu.gpus} GPUs; running {gpu.gpus} ranks per node, "
                f"not {variable}={given}",
                file=sys.stderr,
            )
        return gpu.gpus
    if "TRN_INSTANCE_TYPE" not in env:
        return _outside_count(variable, given)
    import trn_catalog

    spec = trn_catalog.get(env["TRN_INSTANCE_TYPE"])
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


def _outside_count(variable: str, given: str | None) -> int:
    """Ranks per node outside the platform, where no instance type says how many."""
    if given is None:
        return 1
    if given.isdigit() and int(given):
        return int(given)
    raise ValueError(
        f"{variable}={given!r} is not a whole number of ranks, and without TRN_INSTANCE_TYPE "
        "the catalog cannot count them: name the node's type in TRN_INSTANCE_TYPE or give a "
        "count"
    )


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
    """``--device cuda`` on a GPU node; ``--device <the stack's device>`` where the image names
    its stack (``NEURON_STACK``), so that a missing device is an error rather than a run on
    CPU; else nothing (auto)."""
    if gpu_spec(env) is not None:
        return ["--device", "cuda"]
    return ["--device", stacks.of(env).device] if "NEURON_STACK" in env else []


def instance_type(env: Mapping[str, str]) -> str | None:
    """The node's instance type for the trainer's ``--instance-type`` (its stack check and MFU
    peak): the GPU type on a GPU node, else ``TRN_INSTANCE_TYPE``; None outside the platform."""
    return env.get(GPU_INSTANCE_TYPE_ENV) or env.get("TRN_INSTANCE_TYPE")


def torchrun_argv(
    env: Mapping[str, str],
    train_args: Sequence[str],
    *,
    shutdown_flag: bool = False,
    command: str = "run",
) -> list[str]:
    """:func:`torchrun_prefix` running ``trn-train <command>`` (default ``run``) on the node's
    :func:`instance_type` where there is one, with its device (:func:`stack_device_args`);
    ``train_args`` come last and win."""
    instance = instance_type(env)
    return [
        *torchrun_prefix(env, shutdown_flag=shutdown_flag),
        *["-m", "trainer", command],
        *(["--instance-type", instance] if instance else []),
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
    """The image's entrypoint: ``entrypoint.py [trainer run flags...]``. Refuses an image that
    cannot run on this node (exit 2; see :func:`node_environment`). With ``TRN_PRECOMPILE=1``
    (``trnctl job submit --precompile``) it first runs :func:`precompile_argv` on a trn node (a
    GPU node refuses it: exit 2); a failing pre-pass (too little host memory for the compilers,
    say) stops the job with its exit status."""
    train_args = list(sys.argv[1:] if argv is None else argv)
    try:
        env = node_environment(os.environ)
        run = torchrun_argv(env, train_args, shutdown_flag=torchrun_takes_shutdown_timeout())
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if env.get(PRECOMPILE_ENV) == "1":
        if gpu_spec(env) is not None:
            print(
                f"error: {PRECOMPILE_ENV}=1 fills the Neuron compile cache; a GPU node has "
                "none (submit without --precompile)",
                file=sys.stderr,
            )
            return 2
        code = subprocess.run(precompile_argv(env, train_args), env=env, check=False).returncode
        if code:
            return code
    return _run_forwarding_sigterm(run, env)
