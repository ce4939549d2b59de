"""A tiny Kubernetes API server on 127.0.0.1 with just the endpoints trnctl calls, so that the
real kubernetes client's requests run end to end: TrainingRuntime get, TrainJob create/get/delete,
pod and node lists by label selector, pod log (plain, follow, and the previous container's), and
for pipelines CronJob create/get/list/replace/patch/delete, Job create and Event create."""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

TRAINER = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/(?P<ns>[^/]+)"
BATCH = "/apis/batch/v1/namespaces/(?P<ns>[^/]+)"
ROUTES = [
    ("GET", re.compile(TRAINER + r"/trainingruntimes/(?P<name>[^/]+)$"), "runtime"),
    ("POST", re.compile(TRAINER + r"/trainjobs$"), "create"),
    ("GET", re.compile(TRAINER + r"/trainjobs/(?P<name>[^/]+)$"), "get"),
    ("GET", re.compile(r"/api/v1/namespaces/(?P<ns>[^/]+)/pods$"), "pods"),
    ("GET", re.compile(r"/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)/log$"), "log"),
    ("GET", re.compile(r"/api/v1/nodes$"), "nodes"),
    ("DELETE", re.compile(TRAINER + r"/trainjobs/(?P<name>[^/]+)$"), "delete"),
    ("POST", re.compile(BATCH + r"/cronjobs$"), "cron_create"),
    ("GET", re.compile(BATCH + r"/cronjobs$"), "cron_list"),
    ("GET", re.compile(BATCH + r"/cronjobs/(?P<name>[^/]+)$"), "cron_get"),
    ("PUT", re.compile(BATCH + r"/cronjobs/(?P<name>[^/]+)$"), "cron_replace"),
    ("PATCH", re.compile(BATCH + r"/cronjobs/(?P<name>[^/]+)$"), "cron_patch"),
    ("DELETE", re.compile(BATCH + r"/cronjobs/(?P<name>[^/]+)$"), "cron_delete"),
    ("POST", re.compile(BATCH + r"/jobs$"), "job_create"),
    ("POST", re.compile(r"/api/v1/namespaces/(?P<ns>[^/]+)/events$"), "event"),
]


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any


@dataclass
class FakeKube:
    """State and recorded requests; ``errors[route] = (status, message)`` forces a failure."""

    url: str = ""
    runtime: dict[str, Any] | None = None
    trainjobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    # TrainJob name -> statuses returned by successive GETs (the last one sticks).
    statuses: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    pods: list[dict[str, Any]] = field(default_factory=list)
    logs: dict[str, str] = field(default_factory=dict)
    # Pod name -> the log of its previous (restarted) container.
    previous_logs: dict[str, str] = field(default_factory=dict)
    errors: dict[str, tuple[int, str]] = field(default_factory=dict)
    # Node name -> its labels, and its spec.providerID where set.
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)
    provider_ids: dict[str, str] = field(default_factory=dict)
    on_create: Callable[[dict[str, Any]], None] | None = None
    cronjobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    batch_jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)

    def add_pod(
        self,
        job: str,
        index: int,
        log: str,
        *,
        phase: str = "Succeeded",
        previous_log: str | None = None,
    ) -> str:
        """A node pod of ``job``; with ``previous_log`` its container restarted once."""
        name = f"{job}-node-0-{index}-abcde"
        self.pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": "training",
                    "labels": {
                        "jobset.sigs.k8s.io/jobset-name": job,
                        "jobset.sigs.k8s.io/replicatedjob-name": "node",
                        "batch.kubernetes.io/job-completion-index": str(index),
                    },
                },
                "spec": {
                    "nodeName": f"ip-10-0-0-{index + 10}.ec2.internal",
                    "containers": [{"name": "node", "image": "trainer:1"}],
                },
                "status": {
                    "phase": phase,
                    "containerStatuses": [
                        {
                            "name": "node",
                            "image": "trainer:1",
                            "imageID": "",
                            "ready": False,
                            "restartCount": 0 if previous_log is None else 1,
                            "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
                        }
                    ],
                },
            }
        )
        self.logs[name] = log
        if previous_log is not None:
            self.previous_logs[name] = previous_log
        return name


def _status(code: int, message: str) -> dict[str, Any]:
    reasons = {
        400: "BadRequest",
        403: "Forbidden",
        404: "NotFound",
        409: "AlreadyExists",
        500: "InternalError",
    }
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reasons.get(code, "Unknown"),
        "code": code,
    }


def _matches(labels: dict[str, str], selector: str) -> bool:
    wanted = dict(term.split("=", 1) for term in selector.split(",") if term)
    return all(labels.get(k) == v for k, v in wanted.items())


def _matches_existence(labels: dict[str, str], selector: str) -> bool:
    """``key=value`` terms as :func:`_matches`, and a bare ``key``: the label exists."""
    terms = [term for term in selector.split(",") if term]
    present = [t for t in terms if "=" not in t]
    equal = ",".join(t for t in terms if "=" in t)
    return all(t in labels for t in present) and _matches(labels, equal)


def _handler(state: FakeKube) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = 10

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _send(self, code: int, body: Any, content_type: str = "application/json") -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self, method: str) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            state.requests.append(
                Request(
                    method,
                    parts.path,
                    parse_qs(parts.query),
                    {k.lower(): v for k, v in self.headers.items()},
                    body,
                )
            )
            for verb, pattern, route in ROUTES:
                found = pattern.match(parts.path)
                if verb == method and found:
                    if route in state.errors:
                        code, message = state.errors[route]
                        self._send(code, _status(code, message))
                        return
                    getattr(self, f"_{route}")(found.groupdict(), parse_qs(parts.query), body)
                    return
            self._send(404, _status(404, f"the server could not find {parts.path}"))

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

        def do_PUT(self) -> None:
            self._route("PUT")

        def do_PATCH(self) -> None:
            self._route("PATCH")

        def do_DELETE(self) -> None:
            self._route("DELETE")

        def _delete(self, p: dict[str, str], q: Any, body: Any) -> None:
            if state.trainjobs.pop(p["name"], None) is None:
                self._send(
                    404, _status(404, f'trainjobs.trainer.kubeflow.org "{p["name"]}" not found')
                )
                return
            state.deleted.append(p["name"])
            state.pods = [
                pod
                for pod in state.pods
                if pod["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") != p["name"]
            ]
            self._send(200, _status(200, "deleted") | {"status": "Success"})

        def _missing_cronjob(self, name: str) -> None:
            self._send(404, _status(404, f'cronjobs.batch "{name}" not found'))

        def _cron_create(self, p: dict[str, str], q: Any, body: Any) -> None:
            name = body["metadata"]["name"]
            if name in state.cronjobs:
                self._send(409, _status(409, f'cronjobs.batch "{name}" already exists'))
                return
            # The API server gives each object a uid, kept for its life (replaces included).
            uid = str(uuid.uuid4())
            stored = {**body, "metadata": {**body["metadata"], "resourceVersion": "1", "uid": uid}}
            state.cronjobs[name] = stored
            self._send(201, stored)

        def _cron_list(self, p: dict[str, str], q: dict[str, list[str]], body: Any) -> None:
            selector = q.get("labelSelector", [""])[0]
            items = [
                c
                for c in state.cronjobs.values()
                if _matches_existence(c["metadata"].get("labels", {}), selector)
            ]
            self._send(200, {"apiVersion": "batch/v1", "kind": "CronJobList", "items": items})

        def _cron_get(self, p: dict[str, str], q: Any, body: Any) -> None:
            if p["name"] not in state.cronjobs:
                self._missing_cronjob(p["name"])
            else:
                self._send(200, state.cronjobs[p["name"]])

        def _cron_replace(self, p: dict[str, str], q: Any, body: Any) -> None:
            current = state.cronjobs.get(p["name"])
            if current is None:
                self._missing_cronjob(p["name"])
                return
            if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                self._send(409, _status(409, "the object has been modified"))
                return
            version = str(int(current["metadata"]["resourceVersion"]) + 1)
            state.cronjobs[p["name"]] = {
                **body,
                "metadata": {
                    **body["metadata"],
                    "resourceVersion": version,
                    "uid": current["metadata"]["uid"],
                },
            }
            self._send(200, state.cronjobs[p["name"]])

        def _cron_patch(self, p: dict[str, str], q: Any, body: Any) -> None:
            current = state.cronjobs.get(p["name"])
            if current is None:
                self._missing_cronjob(p["name"])
                return
            current["spec"] = {**current["spec"], **body.get("spec", {})}
            self._send(200, current)

        def _cron_delete(self, p: dict[str, str], q: Any, body: Any) -> None:
            if state.cronjobs.pop(p["name"], None) is None:
                self._missing_cronjob(p["name"])
            else:
                self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})

        def _job_create(self, p: dict[str, str], q: Any, body: Any) -> None:
            state.batch_jobs[body["metadata"]["name"]] = body
            self._send(201, body)

        def _event(self, p: dict[str, str], q: Any, body: Any) -> None:
            state.events.append(body)
            named = {**body, "metadata": {**body["metadata"], "name": f"e{len(state.events)}"}}
            self._send(201, named)

        def _runtime(self, p: dict[str, str], q: Any, body: Any) -> None:
            if state.runtime is None:
                self._send(404, _status(404, f'trainingruntimes "{p["name"]}" not found'))
            else:
                self._send(200, state.runtime)

        def _create(self, p: dict[str, str], q: Any, body: Any) -> None:
            name = body["metadata"]["name"]
            if name in state.trainjobs:
                self._send(
                    409, _status(409, f'trainjobs.trainer.kubeflow.org "{name}" already exists')
                )
                return
            state.trainjobs[name] = body
            if state.on_create is not None:
                state.on_create(body)
            self._send(201, body)

        def _get(self, p: dict[str, str], q: Any, body: Any) -> None:
            job = state.trainjobs.get(p["name"])
            if job is None:
                self._send(
                    404, _status(404, f'trainjobs.trainer.kubeflow.org "{p["name"]}" not found')
                )
                return
            sequence = state.statuses.get(p["name"])
            if sequence:
                job = {**job, "status": sequence[0]}
                if len(sequence) > 1:
                    sequence.pop(0)
            self._send(200, job)

        def _pods(self, p: dict[str, str], q: dict[str, list[str]], body: Any) -> None:
            selector = q.get("labelSelector", [""])[0]
            items = [pod for pod in state.pods if _matches(pod["metadata"]["labels"], selector)]
            self._send(200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})

        def _nodes(self, p: dict[str, str], q: dict[str, list[str]], body: Any) -> None:
            selector = q.get("labelSelector", [""])[0]
            items = [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": n, "labels": labels},
                    **(
                        {"spec": {"providerID": state.provider_ids[n]}}
                        if n in state.provider_ids
                        else {}
                    ),
                }
                for n, labels in state.nodes.items()
                if _matches(labels, selector)
            ]
            self._send(
                200, {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": items}
            )

        def _log(self, p: dict[str, str], q: dict[str, list[str]], body: Any) -> None:
            name = p["name"]
            if name not in state.logs:
                self._send(404, _status(404, f'pods "{name}" not found'))
            elif q.get("previous", ["false"])[0].lower() != "true":
                self._send(200, state.logs[name], "text/plain")
            elif name in state.previous_logs:
                self._send(200, state.previous_logs[name], "text/plain")
            else:  # what the API server answers for a container that never restarted
                container = q.get("container", [""])[0]
                message = f'previous terminated container "{container}" in pod "{name}" not found'
                self._send(400, _status(400, message))

    return Handler


def serve() -> Iterator[FakeKube]:
    """Runs a :class:`FakeKube` on a free loopback port for the duration of the generator."""
    state = FakeKube()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def training_runtime(pod: dict[str, Any], name: str = "neuron-torch") -> dict[str, Any]:
    """A TrainingRuntime whose one replicated job (``node``, the trainer step) runs ``pod``: the
    parts of a runtime the drift check reads, as the workspace writes them."""
    trainer = {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    job_template = {"metadata": {"labels": trainer}, "spec": {"template": {"spec": pod}}}
    node = {"name": "node", "template": job_template}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainingRuntime",
        "metadata": {"name": name, "namespace": "training"},
        "spec": {"mlPolicy": {"torch": {}}, "template": {"spec": {"replicatedJobs": [node]}}},
    }
