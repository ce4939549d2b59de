"""``trnctl validate``: the validation TrainJob and the judgement of what its nodes report.

Each node's pod runs ``python3 -m trainer.validate_node`` (shipped in the training image), which
prints one JSON line per node (see ``trainer.validate_node``). This module renders that job,
parses those lines out of the pod logs and compares them with the instance catalog.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from trn_catalog import ultraservers
from trn_catalog.instances import InstanceSpec
from trn_catalog.outputs import EnvironmentOutputs
from trnctl import jobs

COMMAND = ("python3", "-m", "trainer.validate_node")
RESULT_KEYS = ("node", "neuron_devices", "neuron_cores", "efa_interfaces", "allreduce_ok")
# The process group backend each of the image's Neuron stacks runs its collectives on (the
# trainer's NeuronBackend and XlaBackend). Any other (gloo: CPU over TCP) means the node did not
# validate its Neuron devices and EFA at all.
STACK_BACKENDS = {"native": "neuron", "xla": "xla"}
_BACKEND_NAMES = {"gloo": "gloo (CPU over TCP)", "nccl": "nccl (CUDA)"}


def render(
    outputs: EnvironmentOutputs,
    *,
    now: datetime,
    name: str | None = None,
    image: str | None = None,
    size_mib: int = 64,
    iterations: int = 10,
    ultraserver: bool = False,
    across_ultraservers: bool = False,
) -> dict[str, Any]:
    """The validation TrainJob: one pod per trn node of the environment; with ``ultraserver``
    one per node of one UltraServer (its all-reduce runs inside it), with
    ``across_ultraservers`` one per node of two.

    Raises:
        TrnctlError: USAGE for a placement the environment cannot make (as
            :func:`jobs.render`).
    """
    job_name = jobs.validate_name(name) if name else jobs.generated_name("validate", "", now)
    return jobs.render(
        name=job_name,
        outputs=outputs,
        nodes=node_count(outputs, ultraserver, across_ultraservers),
        image=image,
        command=COMMAND,
        args=["--size-mib", str(size_mib), "--iterations", str(iterations)],
        labels={jobs.PURPOSE_LABEL: "validate"},
        ultraserver=ultraserver,
        across_ultraservers=across_ultraservers,
    )


def node_count(outputs: EnvironmentOutputs, ultraserver: bool, across: bool) -> int:
    """Nodes the validation job runs on: all trn nodes, one UltraServer's or two's."""
    if (ultraserver or across) and outputs.ultraserver_type:
        servers = ultraservers.get(outputs.ultraserver_type).servers
        return servers * (2 if across else 1)
    return outputs.trn_nodes


def device_note(outputs: EnvironmentOutputs) -> str:
    """How the environment's trn nodes get their devices and the LNC the validation job runs
    at, e.g. ``devices dra, LNC 2 (per job)`` or ``devices plugin, LNC 1 (node setting)``."""
    lnc = jobs.job_lnc(outputs, None)
    where = "per job" if outputs.devices == "dra" else "node setting"
    return f"devices {outputs.devices}, LNC {lnc} ({where})"


@dataclass(frozen=True)
class NodeResult:
    """What one node's pod reported (``report`` None: no usable line), and the verdict."""

    index: int
    pod: str
    report: dict[str, Any] | None
    problems: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.problems


def parse(log: str) -> dict[str, Any] | None:
    """The last JSON object in ``log`` that carries every key of :data:`RESULT_KEYS`."""
    found = None
    for line in log.splitlines():
        text = line.strip()
        if not text.startswith("{"):
            continue
        try:
            value = json.loads(text)
        except ValueError:
            continue
        if isinstance(value, dict) and all(key in value for key in RESULT_KEYS):
            found = value
    return found


def judge(index: int, pod: str, log: str, spec: InstanceSpec) -> NodeResult:
    """Compares one node's report with the catalog entry ``spec``, and its all-reduce's backend
    with its stack's (:func:`backend_problem`)."""
    report = parse(log)
    if report is None:
        return NodeResult(index, pod, None, ("no validation result line in the pod's log",))
    problems: list[str] = []
    devices = report.get("neuron_devices")
    if devices != spec.chips:
        problems.append(f"neuron devices {devices}, catalog {spec.chips}")
    cores = report.get("neuron_cores")
    # neuron-ls counts physical NeuronCores per device; whether it reports logical ones when
    # LNC=2 is not documented (unverified), so either figure of the catalog passes.
    if cores not in (spec.neuron_cores, spec.logical_neuron_cores):
        problems.append(
            f"neuron cores {cores}, catalog {spec.neuron_cores} "
            f"({spec.logical_neuron_cores} logical)"
        )
    efa = report.get("efa_interfaces")
    if efa != spec.efa_interfaces:
        problems.append(f"EFA interfaces {efa}, catalog {spec.efa_interfaces}")
    if report.get("allreduce_ok") is not True:
        error = report.get("error")
        problems.append("all-reduce failed" + (f": {error}" if error else ""))
    if "backend" in report or report.get("allreduce_ok") is True:
        backend = backend_problem(report)
        if backend:
            problems.append(backend)
    return NodeResult(index, pod, report, tuple(problems))


def backend_problem(report: dict[str, Any]) -> str | None:
    """Why the all-reduce of ``report`` did not run on the Neuron backend of the image's stack
    (``report["stack"]``; either Neuron backend where the report names no known stack), or
    None."""
    stack = report.get("stack")
    backend = report.get("backend")
    expected = STACK_BACKENDS.get(stack) if isinstance(stack, str) else None
    allowed = (expected,) if expected else tuple(STACK_BACKENDS.values())
    if backend in allowed:
        return None
    ran = _BACKEND_NAMES.get(str(backend), str(backend)) if backend else "an unreported backend"
    wanted = (
        f"{expected} (the {stack} stack's Neuron backend)"
        if expected
        else f"a Neuron backend ({' or '.join(allowed)})"
    )
    return f"all-reduce ran on {ran}, not {wanted}"


def missing_nodes(results: Sequence[NodeResult], expected: int) -> list[int]:
    """Node indexes in ``range(expected)`` with no pod at all."""
    seen = {r.index for r in results}
    return [i for i in range(expected) if i not in seen]
