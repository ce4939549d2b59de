from pathlib import Path

import pytest

from trainer import cli, metrics


def test_prepare_data_then_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("hello trainium " * 200)
    assert (
        cli.main(
            [
                "prepare-data",
                "--out",
                str(tmp_path / "d"),
                "--corpus",
                str(corpus),
                "--shard-tokens",
                "1000",
            ]
        )
        == 0
    )
    assert "wrote 3 shards, 3000 tokens" in capsys.readouterr().out

    log = metrics.MetricsLog(str(tmp_path / "m.jsonl"), total_steps=3, progress=False)
    for step in (1, 2, 3):
        log.write({"step": step, "loss": 3.0 / step, "lr": 1e-3, "tokens_per_s": 1000.0 * step})
    log.close()
    assert cli.main(["report", str(tmp_path / "m.jsonl"), "--out", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_metrics_read_keeps_the_last_record_of_a_repeated_step(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1, "loss": 5}\n{"step": 2, "loss": 4}\n{"step": 2, "loss": 3.5}\n')
    assert [r["loss"] for r in metrics.read(path)] == [5, 3.5]


def test_run_validates_before_training(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="checkpoint_every needs checkpoint_dir"):
        cli.main(["run", "--data", str(tmp_path), "--checkpoint-every", "5", "--debug"])
    with pytest.raises(ValueError, match="max_steps must be >= 1, got 0"):
        cli.main(["run", "--data", str(tmp_path), "--max-steps", "0", "--debug"])


def test_verify_data_is_off_unless_asked() -> None:
    assert cli._parser().parse_args(["run", "--data", "d"]).verify_data is False
    assert cli._parser().parse_args(["run", "--data", "d", "--verify-data"]).verify_data is True


def test_compile_fills_the_cache_for_two_steps_and_saves_nothing(
    corpus_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--data", str(corpus_dir), "--device", "cpu", "--compile", "none"]
    args += ["--max-steps", "500", "--checkpoint-dir", str(tmp_path / "ck")]
    args += ["--checkpoint-every", "1", "--metrics", str(tmp_path / "m.jsonl")]

    assert cli.main(["compile", *args, "--compile-memory-gib", "0.01"]) == 0

    assert '{"compiled_steps": 2}' in capsys.readouterr().err
    assert not (tmp_path / "ck").exists() and not (tmp_path / "m.jsonl").exists()


def test_compile_stops_before_compiling_when_memory_is_short(
    corpus_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(
        ["compile", "--data", str(corpus_dir), "--device", "cpu", "--compile-memory-gib", "1e9"]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("trn-train: error: compiling needs 1000000000.0 GiB of host memory")
    assert "GiB is available (" in err


def test_compile_memory_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli._parser().parse_args(["compile", "--data", "d", "--compile-memory-gib", "0"])
    assert "--compile-memory-gib must be a number of GiB above 0, got '0'" in (
        capsys.readouterr().err
    )
