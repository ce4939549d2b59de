"""``python -m trainer.validate_node``: check one trn node and the fabric between nodes.

``trnctl validate`` runs this in every node pod of a TrainJob. Started without ``LOCAL_RANK``
(the node mode), it sets the job environment as the training entrypoint does
(:func:`trainer.launch.job_environment`) and starts torchrun with one rank per logical
NeuronCore; each rank (``--worker``) joins one process group across all nodes, on the device
of the image's Neuron stack (``NEURON_STACK``: ``neuron`` for native, ``xla`` for xla; ``auto``
without one), and times an all-reduce. Local rank 0 of each node also counts the Neuron
devices and cores (``neuron-ls --json-output``) and the EFA interfaces
(``/sys/class/infiniband``, else ``fi_info -p efa``), then prints one JSON line::

    {"node": ..., "node_rank": ..., "neuron_devices": ..., "neuron_cores": ...,
     "efa_interfaces": ..., "stack": ..., "device": ..., "allreduce_ok": ...,
     "allreduce_gbps": ..., "world_size": ..., "backend": ...}

``backend`` is the process group backend the all-reduce ran on (absent when it could not
start: ``error`` says why), which ``trnctl validate`` requires to be the stack's Neuron one.

``allreduce_gbps`` is the bus bandwidth in Gbit/s (the NCCL-tests convention:
bytes x 2 (n - 1) / n / time). Counts that cannot be read are null; ``trnctl validate`` compares
them with the instance catalog.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def neuron_inventory(neuron_ls: str = "neuron-ls") -> tuple[int | None, int | None]:
    """(devices, NeuronCores) from ``neuron-ls --json-output``: a list with one object per
    device carrying ``nc_count``; (None, None) if the tool is missing, fails or prints no list."""
    if shutil.which(neuron_ls) is None:
        return None, None
    try:
        done = subprocess.run(
            [neuron_ls, "--json-output"], capture_output=True, text=True, timeout=60, check=False
        )
        devices = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None, None
    if not isinstance(devices, list):
        return None, None
    cores = sum(int(d.get("nc_count", 0)) for d in devices if isinstance(d, dict))
    return len(devices), cores


def efa_interfaces(sysfs: Path = Path("/sys"), fi_info: str = "fi_info") -> int | None:
    """EFA devices: entries of ``<sysfs>/class/infiniband`` (the EFA kernel driver registers one
    RDMA device per interface), else the distinct domains that ``fi_info -p efa`` lists; None
    when neither can be read."""
    rdma = sysfs / "class" / "infiniband"
    if rdma.is_dir():
        return sum(1 for _ in rdma.iterdir())
    if shutil.which(fi_info) is None:
        return None
    try:
        done = subprocess.run(
            [fi_info, "-p", "efa", "-t", "FI_EP_RDM"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return 0
    domains = {
        line.split(":", 1)[1].strip()
        for line in done.stdout.splitlines()
        if line.strip().startswith("domain:")
    }
    return len(domains)


def allreduce(size_mib: int, iterations: int, device: str) -> dict[str, Any]:
    """Times ``iterations`` all-reduces of ``size_mib`` MiB per rank on the backend of
    :func:`trainer.device.resolve`, each from its start to the device finishing it (on XLA the
    step is marked inside the timed window); every rank checks the sum. Needs an initialized-by-env
    process group setting (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...)."""
    import torch
    import torch.distributed as dist

    from trainer import device as devices

    backend = devices.resolve(
        device, compile_backend="none", local_rank=int(os.environ.get("LOCAL_RANK", "0"))
    )
    dist.init_process_group(backend.dist_backend)
    try:
        backend.start()  # after the process group: see Backend.start
        rank, world = dist.get_rank(), dist.get_world_size()
        numel = max(1, size_mib * (1 << 20) // 4)
        buffer = torch.empty(numel, dtype=torch.float32, device=backend.device)
        expected = world * (world + 1) / 2
        ok, elapsed = True, 0.0
        # The first round warms up (and on XLA builds and compiles the graphs) and is not timed.
        # A lazy backend (XLA) runs queued work only at a step mark: the fill runs before the
        # clock starts, the all-reduce inside the timed window.
        for step in range(iterations + 1):
            buffer.fill_(float(rank + 1))
            backend.step_boundary()
            backend.synchronize()
            dist.barrier()
            started = time.perf_counter()
            dist.all_reduce(buffer)
            backend.step_boundary()
            backend.synchronize()
            if step:
                elapsed += time.perf_counter() - started
            ok = ok and bool(torch.all(buffer == expected).item())
        # Every rank's verdict counts: a node passes only if the all-reduce was right everywhere.
        verdict = torch.tensor([1.0 if ok else 0.0], device=backend.device)
        dist.all_reduce(verdict, op=dist.ReduceOp.MIN)
        seconds = elapsed / max(1, iterations)
        bus_bytes = numel * 4 * 2 * (world - 1) / world if world > 1 else numel * 4
        return {
            "allreduce_ok": bool(verdict.item() == 1.0),
            "allreduce_gbps": round(bus_bytes * 8 / seconds / 1e9, 3) if seconds > 0 else None,
            "world_size": world,
            "backend": backend.dist_backend,
        }
    finally:
        dist.destroy_process_group()


def worker(args: argparse.Namespace) -> int:
    try:
        result = allreduce(args.size_mib, args.iterations, args.device)
    except Exception as error:  # reported in the node's line, judged by trnctl
        result = {"allreduce_ok": False, "allreduce_gbps": None, "error": f"{error}"[:300]}
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        devices, cores = neuron_inventory(args.neuron_ls)
        line = {
            "node": socket.gethostname(),
            "node_rank": int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0"))),
            "neuron_devices": devices,
            "neuron_cores": cores,
            "efa_interfaces": efa_interfaces(Path(args.sysfs), args.fi_info),
            "stack": os.environ.get("NEURON_STACK"),
            "device": args.device,
            **result,
        }
        print(json.dumps(line), flush=True)
    return 0 if result.get("allreduce_ok") else 1


def launch(args: argparse.Namespace, passthrough: Sequence[str]) -> int:
    """Node mode: torchrun over this node's ranks, each running ``--worker``; exit 2, with one
    line, where the node's environment contradicts itself (the launcher's ValueErrors)."""
    from trainer import launch as entry

    try:
        env = entry.job_environment(os.environ, compiler=entry.compiler_version())
        prefix = entry.torchrun_prefix(env)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    entry.prepare_cache(env)
    # The image's stack device, as for training: without a Neuron device the all-reduce fails
    # rather than passing over CPU and TCP. A --device given here comes later and wins.
    argv = [
        *prefix,
        *["-m", "trainer.validate_node", "--worker"],
        *entry.stack_device_args(env),
        *passthrough,
    ]
    return subprocess.run(argv, env=env, check=False).returncode


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer.validate_node", description=__doc__)
    p.add_argument("--size-mib", type=int, default=64, help="all-reduce size per rank")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument(
        "--device",
        default="auto",
        help="trainer device (node mode: the image stack's; auto: xla, neuron, cuda, cpu)",
    )
    p.add_argument("--sysfs", default="/sys", help="sysfs root (tests pass a fake one)")
    p.add_argument("--neuron-ls", default="neuron-ls")
    p.add_argument("--fi-info", default="fi_info")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(arguments)
    if args.worker:
        return worker(args)
    return launch(args, [a for a in arguments if a != "--worker"])


if __name__ == "__main__":
    raise SystemExit(main())
