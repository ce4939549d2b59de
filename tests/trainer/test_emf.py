"""The trainer's CloudWatch metrics: a real run sends one embedded metric format document per
logged interval and per eval to an agent endpoint (a TCP listener here, as the CloudWatch agent's
EMF listener is), each valid against the EMF specification and carrying the metric names the
dashboard and alarms use (trn_catalog.observability)."""

from __future__ import annotations

import io
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trainer import emf, metrics
from trainer.config import TrainConfig
from trainer.loop import train
from trn_catalog import observability as obs

# The units an EMF MetricDefinition may name (CloudWatch API MetricDatum Unit).
UNITS = {
    "Seconds", "Microseconds", "Milliseconds", "Bytes", "Kilobytes", "Megabytes", "Gigabytes",
    "Terabytes", "Bits", "Kilobits", "Megabits", "Gigabits", "Terabits", "Percent", "Count",
    "Bytes/Second", "Kilobytes/Second", "Megabytes/Second", "Gigabytes/Second",
    "Terabytes/Second", "Bits/Second", "Kilobits/Second", "Megabits/Second", "Gigabits/Second",
    "Terabits/Second", "Count/Second", "None",
}  # fmt: skip


def check_emf(doc: dict[str, Any]) -> list[str]:
    """What makes ``doc`` an invalid EMF document (CloudWatch user guide, "Specification:
    Embedded metric format"); empty when valid."""
    problems = []
    meta = doc.get("_aws")
    if not isinstance(meta, dict) or not isinstance(meta.get("Timestamp"), int):
        return ["_aws with an integer Timestamp (epoch ms) is required at the root"]
    for directive in meta.get("CloudWatchMetrics") or []:
        if not isinstance(directive.get("Namespace"), str) or not directive["Namespace"]:
            problems.append("a directive without a Namespace")
        for dimension_set in directive.get("Dimensions", []):
            if len(dimension_set) > 30:
                problems.append(f"{dimension_set}: more than 30 dimensions")
            for name in dimension_set:
                if not isinstance(doc.get(name), str):
                    problems.append(f"dimension {name} is not a string member of the root")
        for metric in directive.get("Metrics", []):
            name = metric.get("Name")
            if not isinstance(doc.get(name), int | float):
                problems.append(f"metric {name} is not a number at the root")
            if metric.get("Unit", "None") not in UNITS:
                problems.append(f"metric {name}: unit {metric.get('Unit')!r}")
    if not meta.get("CloudWatchMetrics"):
        problems.append("no CloudWatchMetrics directive")
    return problems


class Agent:
    """A TCP listener on 127.0.0.1 that takes one connection and keeps every newline-delimited
    document it receives until the sender closes it (``thread`` then ends)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.server.accept()
        except OSError:
            return
        with conn, conn.makefile("r") as lines:
            self.lines += [line for line in lines if line.strip()]

    def documents(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines]

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def agent() -> Iterator[Agent]:
    listener = Agent()
    yield listener
    listener.close()


def _platform(monkeypatch: pytest.MonkeyPatch, port: int) -> None:
    monkeypatch.setenv(obs.EMF_AGENT_ENDPOINT_ENV, f"tcp://127.0.0.1:{port}")
    monkeypatch.setenv(obs.ENVIRONMENT_ENV, "trn-dev")
    monkeypatch.setenv(obs.JOB_ENV, "train-tiny")
    monkeypatch.setenv(metrics.CAPACITY_ENV, "capacity-block")
    monkeypatch.setenv(metrics.CAPACITY_RESERVATION_ENV, "cr-0123456789abcdef0")


def test_a_run_sends_an_emf_document_per_interval_and_eval(
    corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, agent: Agent
) -> None:
    _platform(monkeypatch, agent.port)
    cfg = TrainConfig(
        preset="tiny",
        device="cpu",
        compile="none",
        data=str(corpus_dir),
        max_steps=4,
        log_every=2,
        micro_batch=2,
        metrics=str(tmp_path / "m.jsonl"),
        peak_flops=2e11,
    )
    train(cfg)
    agent.thread.join(timeout=5)

    documents = agent.documents()
    records = metrics.read(tmp_path / "m.jsonl")
    assert len(documents) == len(records) == 2
    for doc, record in zip(documents, records, strict=True):
        assert check_emf(doc) == []
        (directive,) = doc["_aws"]["CloudWatchMetrics"]
        assert directive["Namespace"] == obs.NAMESPACE
        assert directive["Dimensions"] == [["Environment", "Job"], ["Environment"]]
        assert {m["Name"]: m["Unit"] for m in directive["Metrics"]} == dict(obs.TRAIN_METRICS)
        assert (doc["Environment"], doc["Job"]) == ("trn-dev", "train-tiny")
        assert doc["_aws"]["LogGroupName"] == "/aws/trn-platform/trn-dev/training"
        assert doc[obs.STEP] == record["step"]
        assert doc[obs.LOSS] == pytest.approx(record["loss"])
        assert doc[obs.TOKENS_PER_SECOND] == pytest.approx(record["tokens_per_s"])
        assert doc[obs.STEP_TIME] == pytest.approx(record["step_time_s"])
        assert doc[obs.MFU] == pytest.approx(record["mfu"] * 100)
        assert doc[obs.LOGGED_INTERVALS] == 1
    header = metrics.headers(tmp_path / "m.jsonl")[0]
    assert {k: header[k] for k in metrics.PLATFORM_FIELDS} == {
        "environment": "trn-dev",
        "job": "train-tiny",
        "capacity": "capacity-block",
        "capacity_reservation_id": "cr-0123456789abcdef0",
    }


def test_an_eval_record_becomes_an_eval_loss_metric(agent: Agent) -> None:
    sink = emf.EmfSink(f"tcp://127.0.0.1:{agent.port}", environment="e", job="j")
    sink.eval({"step": 4, "eval_loss": 2.5, "eval_tokens": 100})
    sink.eval({"step": 8, "eval_loss": None, "eval_tokens": 0})  # nothing held out: no metric
    sink.close()
    agent.thread.join(timeout=5)

    (doc,) = agent.documents()
    assert check_emf(doc) == []
    assert doc[obs.EVAL_LOSS] == 2.5
    assert [m["Name"] for m in doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]] == [obs.EVAL_LOSS]


def test_an_unreachable_agent_is_reported_once_and_training_goes_on(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]  # closed again: nothing listens there
    stream = io.StringIO()
    sink = emf.EmfSink(f"tcp://127.0.0.1:{port}", environment="e", job="j", stream=stream)
    log = metrics.MetricsLog(str(tmp_path / "m.jsonl"), total_steps=2, progress=False, sink=sink)
    record = {"step": 1, "loss": 2.0, "lr": 1e-3, "tokens_per_s": 10.0, "mfu": None}
    log.write(record)
    log.write({**record, "step": 2})
    log.close()

    assert sink.failed
    assert stream.getvalue().count("CloudWatch metrics off: cannot send to the agent at") == 1
    assert [r["step"] for r in metrics.read(tmp_path / "m.jsonl")] == [1, 2]


@pytest.mark.parametrize(
    "env",
    [{}, {obs.EMF_AGENT_ENDPOINT_ENV: "tcp://a:1"}, {obs.ENVIRONMENT_ENV: "e", obs.JOB_ENV: "j"}],
)
def test_no_sink_outside_the_platform(env: dict[str, str]) -> None:
    assert emf.from_env(env) is None


@pytest.mark.parametrize("endpoint", ["udp://a:1", "tcp://a", "a:25888", "tcp://:25888"])
def test_a_malformed_endpoint_is_refused_naming_the_variable(endpoint: str) -> None:
    env = {obs.EMF_AGENT_ENDPOINT_ENV: endpoint, obs.ENVIRONMENT_ENV: "e", obs.JOB_ENV: "j"}
    with pytest.raises(ValueError, match=rf"AWS_EMF_AGENT_ENDPOINT '{endpoint}' is not tcp://"):
        emf.from_env(env)


def test_a_non_finite_value_is_left_out_and_the_document_stays_json(agent: Agent) -> None:
    """JSON has no NaN or infinity (RFC 8259; the EMF specification asks for numbers): a
    diverged run's NaN loss is left out and its other figures still reach the agent."""
    sink = emf.EmfSink(f"tcp://127.0.0.1:{agent.port}", environment="e", job="j")
    sink.train({"step": 3, "loss": float("nan"), "tokens_per_s": float("inf"), "mfu": 0.25})
    sink.close()
    agent.thread.join(timeout=5)

    (line,) = agent.lines

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    doc = json.loads(line, parse_constant=refuse)
    assert check_emf(doc) == []
    names = [m["Name"] for m in doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]]
    assert obs.LOSS not in doc and obs.TOKENS_PER_SECOND not in doc
    assert names == [obs.STEP, obs.LOGGED_INTERVALS, obs.MFU]
    assert doc[obs.MFU] == 25.0
