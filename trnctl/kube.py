"""The kubernetes client for an environment's EKS cluster, without a kubeconfig or the AWS CLI.

The API server's address and CA come from ``eks:DescribeCluster``; the bearer token is made as
``aws eks get-token`` and aws-iam-authenticator make it: a presigned STS GetCallerIdentity URL
that signs the header ``x-k8s-aws-id: <cluster name>``, valid 60 s, base64url-encoded without
padding and prefixed ``k8s-aws-v1.``. EKS accepts such a token for 15 minutes, so the client
asks for a fresh one before every request once the current one is older than
:data:`TOKEN_REFRESH_S`.

Kubernetes API failures leave through :func:`calling` as one-line :class:`TrnctlError`.
"""

from __future__ import annotations

import atexit
import base64
import binascii
import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from trn_catalog import workspace as ws
from trnctl import aws, jobs
from trnctl.errors import ExitCode, TrnctlError, one_line

TOKEN_PREFIX = "k8s-aws-v1."
CLUSTER_ID_HEADER = "x-k8s-aws-id"
TOKEN_EXPIRES_S = 60
TOKEN_REFRESH_S = 600
# Seconds to wait for the API server to answer one request (connect, read); log streams read
# without a limit.
REQUEST_TIMEOUT = (10, 60)


def token(sts: Any, cluster_name: str) -> str:
    """An EKS bearer token for ``cluster_name``, signed with ``sts``'s credentials.

    Args:
        sts: a boto3 STS client in the cluster's region.
        cluster_name: the EKS cluster's name.
    """
    events = sts.meta.events

    def add_header(request: Any, **_: Any) -> None:
        request.headers[CLUSTER_ID_HEADER] = cluster_name

    # The header is not a GetCallerIdentity parameter, so it is added to the request before
    # signing; the presigned URL then lists it in X-Amz-SignedHeaders.
    handler_id = f"trnctl-eks-token-{id(add_header)}"
    events.register("before-sign.sts.GetCallerIdentity", add_header, unique_id=handler_id)
    try:
        url = sts.generate_presigned_url(
            "get_caller_identity", Params={}, ExpiresIn=TOKEN_EXPIRES_S, HttpMethod="GET"
        )
    finally:
        events.unregister("before-sign.sts.GetCallerIdentity", unique_id=handler_id)
    encoded = base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")
    return TOKEN_PREFIX + encoded


@dataclass(frozen=True)
class ClusterEndpoint:
    """Where a cluster's API server is: its URL and base64 CA bundle (None: system CAs)."""

    name: str
    url: str
    ca_data: str | None


def describe(eks: Any, cluster_name: str) -> ClusterEndpoint:
    """The API endpoint of ``cluster_name``.

    Raises:
        TrnctlError: NOT_FOUND when the cluster does not exist; FAILED when it has no endpoint
            yet (still creating).
        botocore.exceptions.ClientError: any other EKS error.
    """
    try:
        cluster = eks.describe_cluster(name=cluster_name)["cluster"]
    except eks.exceptions.ResourceNotFoundException:
        raise TrnctlError(
            f"EKS cluster {cluster_name!r} not found in {eks.meta.region_name}: the environment's "
            "outputs name a cluster that is gone; redeploy the cluster stack",
            ExitCode.NOT_FOUND,
        ) from None
    url = cluster.get("endpoint")
    if not url:
        raise TrnctlError(
            f"EKS cluster {cluster_name!r} has no API endpoint yet (status "
            f"{cluster.get('status', 'unknown')}); wait until it is ACTIVE",
            ExitCode.FAILED,
        )
    ca = (cluster.get("certificateAuthority") or {}).get("data")
    return ClusterEndpoint(cluster_name, url, ca or None)


def _ca_file(ca_data: str) -> str:
    """Writes the decoded CA bundle to a private temporary file, removed when trnctl exits
    (the kubernetes client takes a CA path only)."""
    try:
        pem = base64.b64decode(ca_data, validate=True)
    except binascii.Error:
        raise TrnctlError(
            "EKS returned a certificate authority that is not base64", ExitCode.FAILED
        ) from None
    fd, path = tempfile.mkstemp(prefix="trnctl-eks-ca-", suffix=".crt")
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    atexit.register(_remove, path)
    return path


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


_TOKEN_KEYS = ("BearerToken", "authorization")


def configuration(
    endpoint: ClusterEndpoint,
    make_token: Callable[[], str],
    *,
    clock: Callable[[], float] = time.monotonic,
) -> k8s.Configuration:
    """A client configuration for ``endpoint`` whose bearer token comes from ``make_token`` and
    is renewed once it is :data:`TOKEN_REFRESH_S` old."""
    config = k8s.Configuration()
    config.host = endpoint.url.rstrip("/")
    if endpoint.ca_data:
        config.ssl_ca_cert = _ca_file(endpoint.ca_data)
    # kubernetes >= 36 reads the bearer token under "BearerToken", older clients under
    # "authorization"; both are set so that either sends "authorization: Bearer <token>".
    config.api_key_prefix = {key: "Bearer" for key in _TOKEN_KEYS}
    made_at = [clock()]
    first = make_token()
    config.api_key = {key: first for key in _TOKEN_KEYS}

    def refresh(cfg: k8s.Configuration) -> None:
        if clock() - made_at[0] >= TOKEN_REFRESH_S:
            fresh = make_token()
            cfg.api_key.update({key: fresh for key in _TOKEN_KEYS})
            made_at[0] = clock()

    config.refresh_api_key_hook = refresh
    # One retry on a dropped connection, not urllib3's three: a wrong endpoint should fail fast.
    config.retries = 1
    return config


# Where a pod finds its ServiceAccount's token and the cluster's CA (Kubernetes' "Accessing the
# Kubernetes API from a Pod"), and the variables the kubelet sets for the API server's address.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
IN_CLUSTER_ENV = ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")


def in_cluster() -> bool:
    """Whether trnctl runs in a pod with a ServiceAccount token (a pipeline's controller)."""
    return all(os.environ.get(name) for name in IN_CLUSTER_ENV) and os.path.isfile(
        os.path.join(SERVICE_ACCOUNT_DIR, "token")
    )


def connect_in_cluster() -> k8s.ApiClient:
    """An API client as the pod's ServiceAccount (its projected token, re-read before each
    request once older than :data:`TOKEN_REFRESH_S`, since the kubelet rotates it)."""
    host = os.environ[IN_CLUSTER_ENV[0]]
    port = os.environ[IN_CLUSTER_ENV[1]]
    endpoint = ClusterEndpoint("in-cluster", f"https://{host}:{port}", None)

    def read_token() -> str:
        with open(os.path.join(SERVICE_ACCOUNT_DIR, "token"), encoding="utf-8") as handle:
            return handle.read().strip()

    config = configuration(endpoint, read_token)
    config.ssl_ca_cert = os.path.join(SERVICE_ACCOUNT_DIR, "ca.crt")
    return k8s.ApiClient(config)


def connect(cluster_name: str, region: str) -> k8s.ApiClient:
    """An API client for the EKS cluster ``cluster_name`` in ``region``."""
    endpoint = describe(aws.client("eks", region), cluster_name)
    sts = aws.client("sts", region)
    return k8s.ApiClient(configuration(endpoint, lambda: token(sts, cluster_name)))


@contextlib.contextmanager
def calling(what: str, *, not_found: str | None = None) -> Iterator[None]:
    """Turns Kubernetes API failures while doing ``what`` into one-line errors.

    Args:
        what: the operation, e.g. ``"create TrainJob x in training"``.
        not_found: the message for a 404 (default: ``what`` failed, not found).
    """
    try:
        yield
    except ApiException as error:
        raise _from_api(error, what, not_found) from None
    except urllib3.exceptions.HTTPError as error:
        reason = getattr(error, "reason", None) or error
        raise TrnctlError(
            f"cannot reach the Kubernetes API to {what}: {one_line(str(reason))}; check that "
            "the cluster endpoint is reachable from here (private endpoints need a VPN or "
            "bastion)",
            ExitCode.AWS,
        ) from None


def _from_api(error: ApiException, what: str, not_found: str | None) -> TrnctlError:
    status = int(error.status or 0)
    message = _api_message(error)
    if status == 401:
        return TrnctlError(
            f"the Kubernetes API did not accept the EKS token to {what} (401): the IAM "
            "principal has no access entry on the cluster, or the clock is off",
            ExitCode.AWS,
        )
    if status == 403:
        return TrnctlError(
            f"the Kubernetes API refused to {what} (403 Forbidden): {message}; grant the IAM "
            "principal an EKS access entry with rights in the namespace",
            ExitCode.AWS,
        )
    if status == 404:
        return TrnctlError(not_found or f"cannot {what}: not found ({message})", ExitCode.NOT_FOUND)
    if status == 409:
        return TrnctlError(f"cannot {what}: {message}", ExitCode.USAGE)
    return TrnctlError(f"Kubernetes API error to {what} ({status}): {message}", ExitCode.FAILED)


def _api_message(error: ApiException) -> str:
    """The ``message`` of a Kubernetes Status body, else the HTTP reason."""
    import json

    try:
        body = json.loads(error.body or "")
    except (TypeError, ValueError):
        body = None
    if isinstance(body, dict) and body.get("message"):
        return one_line(str(body["message"]))
    return one_line(str(error.reason or "no detail"))


class Cluster:
    """The calls trnctl makes in one environment's namespace."""

    def __init__(self, api: k8s.ApiClient, namespace: str) -> None:
        self.namespace = namespace
        self.custom = k8s.CustomObjectsApi(api)
        self.core = k8s.CoreV1Api(api)

    def _custom(self, method: Callable[..., Any], plural: str, **kwargs: Any) -> Any:
        return method(
            ws.TRAINER_API_GROUP,
            ws.TRAINER_API_VERSION,
            self.namespace,
            plural,
            _request_timeout=REQUEST_TIMEOUT,
            **kwargs,
        )

    def runtime(self, name: str = ws.RUNTIME_NAME) -> dict[str, Any]:
        """The TrainingRuntime ``name`` (default ``neuron-torch``) of the namespace."""
        with calling(
            f"read TrainingRuntime {name} in {self.namespace}",
            not_found=(
                f"TrainingRuntime {name!r} not found in namespace {self.namespace!r}: "
                "deploy the workloads stack (it installs Kubeflow Trainer and the runtime)"
            ),
        ):
            found: dict[str, Any] = self._custom(
                self.custom.get_namespaced_custom_object, jobs.RUNTIME_PLURAL, name=name
            )
        return found

    def create(self, job: dict[str, Any]) -> dict[str, Any]:
        name = job["metadata"]["name"]
        with calling(
            f"create TrainJob {name} in {self.namespace}",
            not_found=(
                f"the cluster does not serve TrainJobs in namespace {self.namespace!r}: is "
                "Kubeflow Trainer installed and the namespace deployed?"
            ),
        ):
            created: dict[str, Any] = self._custom(
                self.custom.create_namespaced_custom_object, jobs.PLURAL, body=job
            )
        return created

    def get(self, name: str) -> dict[str, Any]:
        with calling(
            f"read TrainJob {name} in {self.namespace}",
            not_found=f"TrainJob {name!r} not found in namespace {self.namespace!r}",
        ):
            found: dict[str, Any] = self._custom(
                self.custom.get_namespaced_custom_object, jobs.PLURAL, name=name
            )
        return found

    def find(self, name: str) -> dict[str, Any] | None:
        """The TrainJob ``name``, or None when there is none."""
        try:
            found: dict[str, Any] = self._custom(
                self.custom.get_namespaced_custom_object, jobs.PLURAL, name=name
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise _from_api(error, f"read TrainJob {name} in {self.namespace}", None) from None
        return found

    def delete(self, name: str) -> None:
        """Deletes the TrainJob ``name`` and, in the background, its pods (absent: nothing)."""
        with calling(f"delete TrainJob {name} in {self.namespace}"):
            try:
                self._custom(
                    self.custom.delete_namespaced_custom_object,
                    jobs.PLURAL,
                    name=name,
                    propagation_policy="Background",
                )
            except ApiException as error:
                if error.status != 404:
                    raise

    def pods(self, name: str, *, index: int | None = None) -> list[Any]:
        with calling(f"list the pods of TrainJob {name} in {self.namespace}"):
            listed = self.core.list_namespaced_pod(
                self.namespace,
                label_selector=jobs.node_selector(name, index=index),
                _request_timeout=REQUEST_TIMEOUT,
            )
        return list(listed.items)

    def node_labels(self, selector: str) -> dict[str, dict[str, str]]:
        """Each node matching the label ``selector``: its name and labels."""
        with calling(f"list the nodes labelled {selector}"):
            listed = self.core.list_node(label_selector=selector, _request_timeout=REQUEST_TIMEOUT)
        return {n.metadata.name: dict(n.metadata.labels or {}) for n in listed.items}

    def provider_ids(self, names: Sequence[str]) -> dict[str, str | None]:
        """Each of the nodes ``names`` that still exists: its ``spec.providerID``
        (``aws:///<az>/<instance id>`` on EKS)."""
        with calling("list the nodes"):
            listed = self.core.list_node(_request_timeout=REQUEST_TIMEOUT)
        wanted = set(names)
        return {
            n.metadata.name: (n.spec.provider_id if n.spec else None)
            for n in listed.items
            if n.metadata.name in wanted
        }

    def log(self, pod: str) -> str:
        """The trainer container's log. Where the container restarted (the runtime's pods
        restart on failure), the previous container's log comes first, then a line saying so,
        then the current one's: a failed attempt's output (a validation worker's result line,
        a traceback) is not lost to its restart."""
        current = self._read_log(pod, previous=False)
        previous = self._read_log(pod, previous=True)
        if not previous:
            return current or ""
        separator = "" if previous.endswith("\n") else "\n"
        return (
            f"{previous}{separator}--- {pod}: the container restarted; the log of the current "
            f"one follows ---\n{current or ''}"
        )

    def _read_log(self, pod: str, *, previous: bool) -> str | None:
        """One container's log; None for ``previous`` when the container never restarted (the
        API server answers 400: no previous terminated container)."""
        # The raw body, decoded here: kubernetes 36 deserializes a text/plain body of response
        # type "str" as the repr of its bytes ("b'...'").
        which = "previous log" if previous else "log"
        with calling(f"read the {which} of pod {pod} in {self.namespace}"):
            try:
                response = self.core.read_namespaced_pod_log(
                    pod,
                    self.namespace,
                    container=ws.TRAINER_CONTAINER,
                    previous=previous,
                    _preload_content=False,
                    _request_timeout=REQUEST_TIMEOUT,
                )
            except ApiException as error:
                if previous and error.status == 400:
                    return None
                raise
        body: bytes = response.data
        return body.decode(errors="replace")

    def follow(self, pod: str) -> Iterator[str]:
        """The pod's log, line by line, until the container exits."""
        with calling(f"follow the log of pod {pod} in {self.namespace}"):
            response = self.core.read_namespaced_pod_log(
                pod,
                self.namespace,
                container=ws.TRAINER_CONTAINER,
                follow=True,
                _preload_content=False,
                _request_timeout=(REQUEST_TIMEOUT[0], None),
            )
            try:
                pending = b""
                for chunk in response.stream(4096):
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        yield line.decode(errors="replace")
                if pending:
                    yield pending.decode(errors="replace")
            finally:
                response.release_conn()


class CronJobs:
    """The CronJobs and Jobs of one namespace (pipelines), and events about them."""

    def __init__(self, api: k8s.ApiClient, namespace: str) -> None:
        self.namespace = namespace
        self.batch = k8s.BatchV1Api(api)
        self.core = k8s.CoreV1Api(api)
        self.api = api

    def _plain(self, obj: Any) -> dict[str, Any]:
        found: dict[str, Any] = self.api.sanitize_for_serialization(obj)
        return found

    def get(self, name: str) -> dict[str, Any]:
        with calling(
            f"read CronJob {name} in {self.namespace}",
            not_found=f"pipeline {name!r} not found (no CronJob {name} in {self.namespace!r})",
        ):
            found = self.batch.read_namespaced_cron_job(
                name, self.namespace, _request_timeout=REQUEST_TIMEOUT
            )
        return self._plain(found)

    def list(self, selector: str) -> list[dict[str, Any]]:
        with calling(f"list the CronJobs labelled {selector} in {self.namespace}"):
            listed = self.batch.list_namespaced_cron_job(
                self.namespace, label_selector=selector, _request_timeout=REQUEST_TIMEOUT
            )
        return [self._plain(item) for item in listed.items]

    def apply(self, cronjob: dict[str, Any]) -> str:
        """Creates ``cronjob``, or replaces the one of its name; ``created`` or ``replaced``."""
        name = cronjob["metadata"]["name"]
        with calling(f"create CronJob {name} in {self.namespace}"):
            try:
                self.batch.create_namespaced_cron_job(
                    self.namespace, cronjob, _request_timeout=REQUEST_TIMEOUT
                )
                return "created"
            except ApiException as error:
                if error.status != 409:
                    raise
            current = self.batch.read_namespaced_cron_job(
                name, self.namespace, _request_timeout=REQUEST_TIMEOUT
            )
            body = {**cronjob, "metadata": {**cronjob["metadata"]}}
            body["metadata"]["resourceVersion"] = current.metadata.resource_version
            self.batch.replace_namespaced_cron_job(
                name, self.namespace, body, _request_timeout=REQUEST_TIMEOUT
            )
        return "replaced"

    def suspend(self, name: str, suspended: bool) -> None:
        with calling(
            f"patch CronJob {name} in {self.namespace}",
            not_found=f"pipeline {name!r} not found (no CronJob {name} in {self.namespace!r})",
        ):
            self.batch.patch_namespaced_cron_job(
                name,
                self.namespace,
                {"spec": {"suspend": suspended}},
                _request_timeout=REQUEST_TIMEOUT,
            )

    def delete(self, name: str) -> None:
        with calling(
            f"delete CronJob {name} in {self.namespace}",
            not_found=f"pipeline {name!r} not found (no CronJob {name} in {self.namespace!r})",
        ):
            self.batch.delete_namespaced_cron_job(
                name,
                self.namespace,
                propagation_policy="Background",
                _request_timeout=REQUEST_TIMEOUT,
            )

    def create_job(self, job: dict[str, Any]) -> None:
        name = job["metadata"]["name"]
        with calling(f"create Job {name} in {self.namespace}"):
            self.batch.create_namespaced_job(self.namespace, job, _request_timeout=REQUEST_TIMEOUT)

    def event(self, event: dict[str, Any]) -> None:
        """Records ``event`` (a core/v1 Event) in the namespace."""
        with calling(f"record an event in {self.namespace}"):
            self.core.create_namespaced_event(
                self.namespace, event, _request_timeout=REQUEST_TIMEOUT
            )
