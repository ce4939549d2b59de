"""``trn-train run --model``, ``score`` and ``export`` end to end on tiny Hugging Face models:
fine-tune, export, load with transformers, same loss; resume exactness and refusals."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import boto3
import hf_tiny
import pytest
import torch
import torch_save_checkpoint
from moto import mock_aws
from transformers import AutoModelForCausalLM, AutoTokenizer

from trainer import checkpoint, cli, hf, hf_config
from trainer.checkpoint import Checkpointer, CheckpointError, RunConfigError, S3Store
from trainer.model import GPT
from trainer.model_spec import model_config

SEQ = hf_tiny.SEQ_LEN
_run = functools.partial(hf_tiny.run_args, lr="3e-3", max_steps="4")


_state = hf_tiny.checkpoint_state


def _score(capsys: pytest.CaptureFixture[str], model: Path, tokens: Path) -> dict[str, float]:
    capsys.readouterr()
    assert cli.main(["score", "--model", str(model), "--tokens", str(tokens)]) == 0
    result: dict[str, float] = json.loads(capsys.readouterr().out)
    return result


def test_fine_tune_export_and_load_with_transformers(
    model_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = hf_tiny.model_dir(tmp_path, "qwen2", tie_word_embeddings=True)
    ck = tmp_path / "ck"
    assert cli.main(_run(source, model_data, ck)) == 0
    assert cli.main(["export", "--checkpoint-dir", str(ck), "--out", str(tmp_path / "out")]) == 0

    tokens = torch.randint(0, 256, (3, SEQ + 1), generator=torch.Generator().manual_seed(3))
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    ours = GPT(hf_config.model_config(source, seq_len=SEQ)).eval()
    ours.load_state_dict(_state(ck, 4)["model"])  # type: ignore[arg-type]
    with torch.no_grad():
        our_loss = float(ours(tokens[:, :-1], tokens[:, 1:]))
    their_loss = hf_tiny.hf_loss(theirs, tokens)
    assert abs(their_loss - our_loss) / our_loss <= 1e-4
    # Training changed the weights: the source model scores the tokens differently.
    assert (
        abs(hf_tiny.hf_loss(hf_tiny.build("qwen2", tie_word_embeddings=True), tokens) - our_loss)
        > 1e-3
    )

    # The tokenizer came through the checkpoint, byte for byte, and loads with its template.
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (tmp_path / "out" / name).read_bytes() == (source / name).read_bytes()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    text = tokenizer.apply_chat_template([{"role": "user", "content": "w5"}], tokenize=False)
    assert text.startswith("user: w5 w1")

    # score gives transformers' loss and counts S * (L - 1) predicted tokens.
    (tmp_path / "tokens.json").write_text(json.dumps(tokens.tolist()))
    scored = _score(capsys, tmp_path / "out", tmp_path / "tokens.json")
    assert scored["tokens"] == 3 * SEQ
    assert abs(scored["loss"] - their_loss) / their_loss <= 1e-5


def test_resume_of_a_model_run_is_bit_identical(model_data: Path, tmp_path: Path) -> None:
    source = hf_tiny.model_dir(tmp_path, "llama", rope_parameters=hf_tiny.LLAMA3_ROPE)
    args = ["--max-steps", "6", "--checkpoint-every", "3"]
    hf_tiny.assert_resume_is_exact(
        lambda ck: _run(source, model_data, ck, *args), tmp_path, last=6, killed_at=3
    )


def test_resume_with_another_model_or_length_is_refused(
    corpus_dir: Path, model_data: Path, tmp_path: Path
) -> None:
    source = hf_tiny.model_dir(tmp_path, "llama", seed=0)
    other = hf_tiny.model_dir(tmp_path, "llama", seed=1)
    ck = tmp_path / "ck"
    assert cli.main(_run(source, model_data, ck, "--max-steps", "2")) == 0
    meta = json.loads((ck / checkpoint.name_for(2) / checkpoint.META).read_text())
    assert meta["run"]["model"] == hf.fingerprint(source) and meta["run"]["seq_len"] == SEQ
    assert meta["model_files"][0] == "config.json"

    with pytest.raises(
        RunConfigError,
        match=f"model '{hf.fingerprint(source)}' in the checkpoint, '{hf.fingerprint(other)}' now",
    ):
        cli.main([*_run(other, model_data, ck, "--max-steps", "4"), "--debug"])
    with pytest.raises(RunConfigError, match="seq_len 16 in the checkpoint, 8 now"):
        cli.main([*_run(source, model_data, ck, "--max-steps", "2"), "--seq-len", "8", "--debug"])
    preset_run = [
        "run",
        "--data",
        str(corpus_dir),
        "--device",
        "cpu",
        "--compile",
        "none",
        "--no-progress",
    ]
    preset_run += ["--checkpoint-dir", str(ck), "--max-steps", "2", "--lr", "3e-3"]
    preset_run += ["--micro-batch", "2"]
    with pytest.raises(
        RunConfigError, match=f"model '{hf.fingerprint(source)}' in the checkpoint, None now"
    ):
        cli.main([*preset_run, "--debug"])


def test_run_flags_are_checked_before_training(tmp_path: Path, model_data: Path) -> None:
    source = hf_tiny.model_dir(tmp_path)
    ck = tmp_path / "ck"
    with pytest.raises(ValueError, match=r"--preset tiny and --model .* exclude each other"):
        cli.main([*_run(source, model_data, ck), "--preset", "tiny", "--debug"])
    with pytest.raises(
        hf_config.HFConfigError, match="seq_len 65 must be between 1 and max_position_embeddings 64"
    ):
        cli.main([*_run(source, model_data, ck), "--seq-len", "65", "--debug"])
    with pytest.raises(
        ValueError, match=re.escape("seq_len must be >= 0 (0: the default), got -1")
    ):
        cli.main([*_run(source, model_data, ck), "--seq-len", "-1", "--debug"])
    small_vocab = hf_tiny.model_dir(tmp_path, vocab_size=128)  # and its own tokenizer
    with pytest.raises(
        ValueError, match=rf"--model {re.escape(str(small_vocab))} has another tokenizer"
    ):
        cli.main([*_run(small_vocab, model_data, ck), "--debug"])
    assert not list(ck.glob("step_*"))


def test_model_runs_default_to_fine_tuning_settings(tmp_path: Path) -> None:
    source = hf_tiny.model_dir(tmp_path)
    cfg = cli.train_config(cli._parser().parse_args(["run", "--data", "d", "--model", str(source)]))
    assert (cfg.batch_per_rank, cfg.peak_lr, cfg.parallelism) == (1, 2e-5, "fsdp")
    assert model_config(cfg).seq_len == 64  # min(2048, max_position_embeddings)
    preset = cli.train_config(cli._parser().parse_args(["run", "--data", "d"]))
    assert (preset.preset, preset.batch_per_rank, model_config(preset).seq_len) == ("tiny", 8, 64)
    longer = cli.train_config(cli._parser().parse_args(["run", "--data", "d", "--seq-len", "96"]))
    assert model_config(longer).seq_len == 96
    assert model_config(longer).d_model == model_config(preset).d_model


BAD_TOKENS = [
    ("{", "unreadable token file"),
    ("[]", "must hold a non-empty JSON list of lists of token ids"),
    ("[[1, 2], [3]]", "sequence 1 must be a list of 2 token ids like sequence 0"),
    ("[[1, 2], 7]", "sequence 1 must be a list of 2 token ids like sequence 0"),
    ('[[1, "a"]]', "sequence 0 holds a value that is not a token id >= 0"),
    ("[[1, -3]]", "sequence 0 holds a value that is not a token id >= 0"),
    ("[[1]]", "sequences need at least 2 tokens, got 1"),
    ("[[1, 256]]", "token id 256 is outside the model's vocabulary (vocab_size 256)"),
    (json.dumps([[1] * 66]), "seq_len 65 must be between 1 and max_position_embeddings 64"),
]


@pytest.mark.parametrize(("text", "message"), BAD_TOKENS)
def test_score_input_errors_are_named(text: str, message: str, tmp_path: Path) -> None:
    source = hf_tiny.model_dir(tmp_path)
    (tmp_path / "t.json").write_text(text)
    with pytest.raises(ValueError, match=re.escape(message)):
        hf.score(source, tmp_path / "t.json")


def test_score_batches_sum_to_the_whole_mean(tmp_path: Path) -> None:
    theirs = hf_tiny.build("mistral", sliding_window=None)
    source = hf_tiny.save(theirs, tmp_path / "m")
    tokens = torch.randint(0, 256, (5, 9), generator=torch.Generator().manual_seed(4))
    (tmp_path / "t.json").write_text(json.dumps(tokens.tolist()))
    loss, count = hf.score(source, tmp_path / "t.json", batch=2)
    assert count == 5 * 8
    assert abs(loss - hf_tiny.hf_loss(theirs, tokens)) / loss <= 1e-5


def test_export_errors_are_named(corpus_dir: Path, tmp_path: Path) -> None:
    from trainer import hf_export

    with pytest.raises(CheckpointError, match=r"checkpoint directory .*/nowhere does not exist"):
        hf_export.export_checkpoint(str(tmp_path / "nowhere"), tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="holds no valid checkpoint to export"):
        hf_export.export_checkpoint(str(tmp_path / "empty"), tmp_path / "out")
    preset_run = [
        "run",
        "--data",
        str(corpus_dir),
        "--device",
        "cpu",
        "--compile",
        "none",
        "--no-progress",
    ]
    assert cli.main([*preset_run, "--max-steps", "1", "--checkpoint-dir", str(tmp_path / "p")]) == 0
    with pytest.raises(
        CheckpointError,
        match=re.escape("carries no config.json: only checkpoints of `trn-train run --model DIR`"),
    ):
        hf_export.export_checkpoint(str(tmp_path / "p"), tmp_path / "out")


@mock_aws
def test_export_from_s3_reads_the_carried_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer import hf_export

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="ckpt")
    source = hf_tiny.model_dir(tmp_path, "qwen3", head_dim=12)
    cfg = hf_config.model_config(source, seq_len=SEQ)
    model = hf.load_pretrained(source, cfg)
    optimizer = torch.optim.AdamW(model.parameters())
    store = S3Store("s3://ckpt/run", client=s3)
    for step in (1, 2, 3):
        Checkpointer(store, keep=2, model_files=hf.carried_files(source)).save(
            step, model, optimizer
        )
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="ckpt")["Contents"])
    assert "run/step_00000003/model/tokenizer.json" in keys
    assert not [k for k in keys if k.startswith("run/step_00000001/")]  # pruned, files and all

    hf_export.export_checkpoint("s3://ckpt/run", tmp_path / "out")
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert torch.equal(
        theirs.model.layers[0].self_attn.q_norm.weight, model.blocks[0].attn.q_norm.weight
    )
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == (
        source / "tokenizer.json"
    ).read_bytes()
    assert not list((tmp_path / "tmp").glob("trn-checkpoints-*"))  # the node copies are gone


def test_an_earlier_trainers_checkpoint_exports(tmp_path: Path) -> None:
    """A checkpoint of the format before DCP (one ``state.pt``) exports as it did."""
    from trainer import hf_export

    source = hf_tiny.model_dir(tmp_path, "qwen3", head_dim=12)
    cfg = hf_config.model_config(source, seq_len=SEQ)
    torch.manual_seed(0)
    model = hf.load_pretrained(source, cfg)
    for p in model.parameters():  # weights the source does not have
        p.data.add_(torch.randn_like(p), alpha=0.01)
    optimizer = torch.optim.AdamW(model.parameters())
    carried = hf.carried_files(source)
    torch_save_checkpoint.write(tmp_path / "ck", 3, model, optimizer, model_files=carried)

    hf_export.export_checkpoint(str(tmp_path / "ck"), tmp_path / "out")

    exported = hf.load_pretrained(tmp_path / "out", cfg).state_dict()
    for name, value in model.state_dict().items():
        assert torch.equal(exported[name], value), name
