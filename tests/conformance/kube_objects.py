"""Every Kubernetes object the platform creates, and strict checks against the pinned APIs.

The app applies manifests through CDK's ``Custom::AWSCDK-EKS-KubernetesResource`` (kubectl with
its default, strict field validation), and ``trnctl`` creates TrainJobs. Built-in kinds are
checked against Kubernetes' own schema for the cluster's version (``kubernetes-validate``,
strict: unknown fields are errors); Kubeflow Trainer kinds against the schema data of the pinned
Trainer release (:mod:`trn_catalog.crds`), their metadata and the pods inside them against
Kubernetes' schema again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema
import kubernetes_validate

from trn_catalog import crds, versions
from trn_catalog import workspace as ws

MANIFEST_TYPE = "Custom::AWSCDK-EKS-KubernetesResource"
HELM_TYPE = "Custom::AWSCDK-EKS-HelmChart"
KUBERNETES = f"{versions.KUBERNETES_VERSION}.0"
# Stands in for a CloudFormation token (a Ref, GetAtt or import) inside a manifest: valid
# wherever the platform puts a token (names, ids, DNS names, an image, a bucket, a region).
PLACEHOLDER = "placeholder"


@dataclass(frozen=True)
class Applied:
    """One object and where it comes from (``stack/logical id`` or ``trnctl ...``)."""

    origin: str
    obj: Mapping[str, Any]

    @property
    def name(self) -> str:
        meta = self.obj.get("metadata") or {}
        return f"{self.origin}: {self.obj.get('kind')} {meta.get('name')}"


def resolve(value: Any) -> str:
    """A template string property with every token replaced by :data:`PLACEHOLDER`."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and set(value) == {"Fn::Join"}:
        separator, parts = value["Fn::Join"]
        return str(separator).join(resolve(part) for part in parts)
    return PLACEHOLDER


def manifests(templates: Mapping[str, Mapping[str, Any]]) -> Iterator[Applied]:
    """Every object of every manifest resource in ``templates`` (stack name -> template)."""
    for stack, template in sorted(templates.items()):
        for logical_id, resource in sorted(template.get("Resources", {}).items()):
            if resource["Type"] != MANIFEST_TYPE:
                continue
            for obj in json.loads(resolve(resource["Properties"]["Manifest"])):
                yield Applied(f"{stack}/{logical_id}", obj)


def helm_values(
    templates: Mapping[str, Mapping[str, Any]],
) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(chart, version, values) of every Helm chart resource in ``templates``."""
    for _, template in sorted(templates.items()):
        for resource in template.get("Resources", {}).values():
            if resource["Type"] == HELM_TYPE:
                props = resource["Properties"]
                values = json.loads(resolve(props.get("Values", "{}")))
                yield props["Chart"], props["Version"], values


# What Trainer's TrainJob webhook checks beyond the CRD (pkg/runtime/framework/plugins/jobset/
# jobset.go at the pinned tag): each runtime patch's manager is a domain-prefixed path, by
# k8s.io/apimachinery's IsDomainPrefixedPath (v0.36.2 in Trainer 2.3.0's go.mod): before the
# first "/" a DNS-1123 subdomain of at most 253 characters, after it a non-empty HTTP path.
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_HTTP_PATH = re.compile(r"[A-Za-z0-9/\-._~%!$&'()*+,;=:]+")


def domain_prefixed_path(value: str) -> bool:
    """Whether apimachinery's IsDomainPrefixedPath accepts ``value`` (e.g. ``acme.io/foo``)."""
    host, slash, path = value.partition("/")
    return (
        bool(slash)
        and len(host) <= 253
        and _DNS1123_SUBDOMAIN.fullmatch(host) is not None
        and _HTTP_PATH.fullmatch(path) is not None
    )


# The containers whose env a runtime patch may not set (the webhook's constants at the tag).
_NO_PATCHED_ENV = ("dataset-initializer", "model-initializer", "node")
_CONTAINER_LISTS = ("initContainers", "containers")


def _dig(obj: Mapping[str, Any], *keys: str) -> Mapping[str, Any]:
    for key in keys:
        obj = obj.get(key) or {}
    return obj


def patch_problems(job: Mapping[str, Any], runtime: Mapping[str, Any]) -> list[str]:
    """What ``job``'s runtime patches may not do to ``runtime``, the runtime it names.

    - Name a replicated job, or a container or init container of one, that the runtime does
      not have: patches merge by name, so such a patch adds an entry the runtime never
      declared (a container without an image) rather than changing one. Ours: Trainer
      v2.3.0's webhook has these checks (jobset.go) but runs them after merging the patches,
      so they never fire (kubeflow/trainer#3948, open); its one set of names per job would
      also let a container's name pass for an init container's, and the reverse.
    - Set ``env`` on the node or initializer containers: the webhook refuses it (containers
      only, not init containers)."""
    names = {}
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        pod = _dig(rjob, "template", "spec", "template", "spec")
        names[rjob["name"]] = {
            key: {c["name"] for c in pod.get(key, [])} for key in _CONTAINER_LISTS
        }
    found = []
    for index, patch in enumerate(job["spec"].get("runtimePatches") or []):
        where = f"spec.runtimePatches.{index}"
        for rjob in _dig(patch, "trainingRuntimeSpec", "template", "spec").get(
            "replicatedJobs", []
        ):
            if rjob["name"] in names:
                found += _container_problems(where, rjob, names[rjob["name"]])
            else:
                found.append(f"{where}: replicated job {rjob['name']!r} is not in the runtime")
    return found


def _container_problems(
    where: str, rjob: Mapping[str, Any], names: Mapping[str, set[str]]
) -> list[str]:
    found = []
    pod = _dig(rjob, "template", "spec", "template", "spec")
    for key in _CONTAINER_LISTS:
        for container in pod.get(key, []):
            name = container["name"]
            if name not in names[key]:
                found.append(
                    f"{where}: {key} {name!r} is not in the runtime's {rjob['name']!r} job"
                )
            elif key == "containers" and container.get("env") and name in _NO_PATCHED_ENV:
                found.append(f"{where}: env on the {name!r} container")
    return found


def problems(obj: Mapping[str, Any]) -> list[str]:
    """Why ``obj`` would be refused by a cluster of the pinned versions (empty: conforms)."""
    group = str(obj.get("apiVersion", "")).partition("/")[0]
    if group == ws.TRAINER_API_GROUP:
        return _trainer_problems(obj)
    return _kubernetes_problems(obj)


def _kubernetes_problems(obj: Mapping[str, Any], where: str = "") -> list[str]:
    try:
        kubernetes_validate.validate(dict(obj), KUBERNETES, strict=True)
    except kubernetes_validate.ValidationError as error:
        path = ".".join(str(p) for p in error.path)
        return [f"{where}{path or '(root)'}: {error.message}"]
    except kubernetes_validate.SchemaNotFoundError as error:
        return [f"{where}no Kubernetes {KUBERNETES} schema: {error}"]
    return []


def _trainer_problems(obj: Mapping[str, Any]) -> list[str]:
    kind = str(obj.get("kind"))
    if kind not in crds.KINDS:
        return [f"{kind} is not a {crds.TRAINER_API} kind of Trainer {crds.release_tag()}"]
    schema = crds.schema(kind)
    validator = jsonschema.validators.validator_for(schema)(schema)
    found = [
        f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
        for e in validator.iter_errors(obj)
    ]
    if found:
        return found
    for index, patch in enumerate(obj["spec"].get("runtimePatches") or []):
        if not domain_prefixed_path(patch["manager"]):
            found.append(
                f"spec.runtimePatches.{index}.manager: {patch['manager']!r} is not a "
                'domain-prefixed path (such as "acme.io/foo"); the TrainJob webhook refuses it'
            )
    # Kubernetes itself validates the metadata and the pods: check those parts on its schema.
    meta = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]}
    found += _kubernetes_problems(meta, "metadata: ")
    for where, embedded in _embedded(obj):
        found += _kubernetes_problems(embedded, where)
    return found


def _patched_pods(
    spec: Mapping[str, Any], pod: dict[str, Any]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each runtime patch's pod spec (affinity, node selector, tolerations) as a Pod."""
    for p, patch in enumerate(spec.get("runtimePatches") or []):
        jobs = patch.get("trainingRuntimeSpec", {}).get("template", {}).get("spec", {})
        for j, job in enumerate(jobs.get("replicatedJobs") or []):
            patched = job.get("template", {}).get("spec", {}).get("template", {})
            pod_spec = {"containers": [{"name": ws.TRAINER_CONTAINER, "image": PLACEHOLDER}]}
            pod_spec.update(patched.get("spec") or {})
            meta = {**pod["metadata"], **(patched.get("metadata") or {})}
            where = f"spec.runtimePatches.{p}...replicatedJobs.{j}: "
            yield where, {**pod, "metadata": meta, "spec": pod_spec}


def _embedded(obj: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    spec = obj["spec"]
    if obj["kind"] == "TrainJob":
        trainer = spec.get("trainer") or {}
        container = {"name": ws.TRAINER_CONTAINER, "image": trainer.get("image", PLACEHOLDER)}
        for field in ("command", "args", "env"):
            if field in trainer:
                container[field] = trainer[field]
        if "resourcesPerNode" in trainer:
            container["resources"] = trainer["resourcesPerNode"]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": PLACEHOLDER}}
        yield "spec.trainer: ", {**pod, "spec": {"containers": [container]}}
        yield from _patched_pods(spec, pod)
        return
    for index, job in enumerate(spec["template"]["spec"]["replicatedJobs"]):
        metadata = {"name": job["name"], **(job["template"].get("metadata") or {})}
        yield (
            f"spec.template.spec.replicatedJobs.{index}.template: ",
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": metadata,
                "spec": job["template"]["spec"],
            },
        )
