"""trnctl model stage against moto's S3: the model-directory checks and their messages, the
upload (multipart, SHA-256, skip intact, replace changed), and a directory written by
transformers that transformers loads back from what was staged."""

from __future__ import annotations

import hashlib
import json
import re
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file
from test_trnctl_aws import OUTPUTS

from tests.s3_writes import S3Writes, Stopped
from trn_catalog import hf_models
from trnctl import aws, models, registry, versioning
from trnctl.errors import ExitCode, TrnctlError

pytestmark = pytest.mark.usefixtures("moto")

BUCKET = OUTPUTS.datasets_bucket
TOKENIZER_WORDS = ["<unk>", "<s>", "</s>", "the", "quick", "brown", "fox", "jumps"]


@pytest.fixture
def s3() -> Any:
    """The datasets bucket of trn-dev (deployed in moto: its SSM outputs)."""
    aws.client("ssm").put_parameter(
        Name="/trn-platform/trn-dev/outputs", Value=OUTPUTS.to_json(), Type="String"
    )
    client = aws.client("s3")
    client.create_bucket(
        Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "us-east-2"}
    )
    return client


def write_tokenizer(root: Path) -> None:
    """A word-level tokenizer.json built in memory with the tokenizers library."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as tok_models

    vocab = {word: i for i, word in enumerate(TOKENIZER_WORDS)}
    tokenizer = Tokenizer(tok_models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(root / "tokenizer.json"))


def tensors(seed: int, count: int = 2, size: int = 16) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        f"layers.{seed}.w{i}": rng.standard_normal(size).astype(np.float32) for i in range(count)
    }


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A hand-made Llama directory: two safetensors shards with an index, tokenizer, config, and
    the files a download often carries that the trainer does not read."""
    root = tmp_path / "tiny-llama"
    root.mkdir()
    weight_map: dict[str, str] = {}
    for shard in (1, 2):
        name = f"model-0000{shard}-of-00002.safetensors"
        part = tensors(shard)
        save_file(part, str(root / name))
        weight_map.update({t: name for t in part})
    index = {"metadata": {"total_size": 256}, "weight_map": weight_map}
    (root / hf_models.WEIGHTS_INDEX_FILE).write_text(json.dumps(index))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 8}
    (root / "config.json").write_text(json.dumps(config))
    (root / "generation_config.json").write_text("{}")
    write_tokenizer(root)
    (root / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 128}))
    (root / "pytorch_model.bin").write_bytes(b"not read")
    (root / ".gitattributes").write_text("*.safetensors filter=lfs")
    (root / "original").mkdir()
    (root / "original" / "consolidated.00.pth").write_bytes(b"not read")
    return root


def stage(trnctl: Any, source: Path, name: str = "tiny-llama", *extra: str) -> Any:
    # "--" ends the options: a name that starts with "-" still reaches the name check.
    return trnctl("model", "stage", "--env", "trn-dev", *extra, "--", str(source), name)


def keys(s3: Any, prefix: str = "models/") -> set[str]:
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return {item["Key"] for item in listed.get("Contents", [])}


def test_stage_uploads_what_the_trainer_reads_and_leaves_the_rest(
    trnctl: Any, s3: Any, model_dir: Path
) -> None:
    run = stage(trnctl, model_dir)

    assert run.exit_code == 0, run.stderr
    assert keys(s3) == {"models/tiny-llama/versions/v1.json"} | {
        f"models/tiny-llama/v1/{name}"
        for name in (
            "model.safetensors.index.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "config.json",
        )
    }
    assert "staged LlamaForCausalLM tiny-llama as models/tiny-llama@v1 (7 files, " in run.stdout
    assert (
        f"at s3://{BUCKET}/models/tiny-llama/v1/: uploaded 7, skipped 0 already intact; promoted"
        in run.stdout
    )
    assert "left out .gitattributes, original/, pytorch_model.bin;" in run.stdout
    assert "trnctl job submit --env trn-dev --model models/tiny-llama" in run.stdout
    for name in ("config.json", "model-00002-of-00002.safetensors"):
        head = s3.head_object(Bucket=BUCKET, Key=f"models/tiny-llama/v1/{name}")
        assert (
            head["Metadata"]["sha256"]
            == hashlib.sha256((model_dir / name).read_bytes()).hexdigest()
        )


def manifest(s3: Any, version: str) -> dict[str, Any]:
    found = versioning.get_json(s3, BUCKET, f"models/tiny-llama/versions/{version}.json")
    assert found is not None
    return found[0]


def test_a_staged_version_records_where_it_came_from_and_is_in_service(
    trnctl: Any, s3: Any, model_dir: Path
) -> None:
    assert stage(trnctl, model_dir).exit_code == 0

    record = manifest(s3, "v1")

    assert record["state"] == "complete" and record["status"] == "promoted"
    assert record["source"] == {"kind": "staged", "path": str(model_dir.resolve())}
    assert record["architecture"] == "LlamaForCausalLM"
    assert record["created_by"] == aws.caller_arn()
    assert [(h["status"], h["by"]) for h in record["history"]] == [("promoted", aws.caller_arn())]
    assert record["files"] == 7
    assert registry.resolve(s3, BUCKET, "models/tiny-llama", "trn-dev").path == (
        "models/tiny-llama/v1"
    )


def test_config_json_goes_up_last(model_dir: Path) -> None:
    """A job checks for config.json to know a stage finished: it is the last upload."""
    model = models.inspect(model_dir)
    items = models.uploads(model, models.prefix(BUCKET, "m"))

    assert [i.key for i in items][-1] == "models/m/config.json"
    assert [i.key for i in items][:3] == [
        "models/m/model.safetensors.index.json",
        "models/m/model-00001-of-00002.safetensors",
        "models/m/model-00002-of-00002.safetensors",
    ]


def test_the_same_files_again_are_the_same_version(trnctl: Any, s3: Any, model_dir: Path) -> None:
    stage(trnctl, model_dir)
    key = "models/tiny-llama/v1/model-00001-of-00002.safetensors"
    before = s3.head_object(Bucket=BUCKET, Key=key)["LastModified"]

    run = stage(trnctl, model_dir)

    assert run.exit_code == 0, run.stderr
    assert "already staged as models/tiny-llama@v1 (promoted); no new version" in run.stdout
    assert s3.head_object(Bucket=BUCKET, Key=key)["LastModified"] == before
    assert keys(s3, "models/tiny-llama/versions/") == {"models/tiny-llama/versions/v1.json"}


def test_a_changed_file_is_a_new_version_and_the_old_one_stays(
    trnctl: Any, s3: Any, model_dir: Path
) -> None:
    stage(trnctl, model_dir)
    v1 = {
        k: s3.head_object(Bucket=BUCKET, Key=k)["ETag"] for k in keys(s3, "models/tiny-llama/v1/")
    }
    (model_dir / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 256}))

    run = stage(trnctl, model_dir)

    assert run.exit_code == 0, run.stderr
    assert "as models/tiny-llama@v2 (7 files, " in run.stdout
    body = s3.get_object(Bucket=BUCKET, Key="models/tiny-llama/v2/tokenizer_config.json")["Body"]
    assert json.loads(body.read()) == {"model_max_length": 256}
    assert {k: s3.head_object(Bucket=BUCKET, Key=k)["ETag"] for k in v1} == v1
    assert registry.resolve(s3, BUCKET, "models/tiny-llama", "trn-dev").path == (
        "models/tiny-llama/v2"
    )
    assert registry.resolve(s3, BUCKET, "models/tiny-llama@v1", "trn-dev").path == (
        "models/tiny-llama/v1"
    )


def test_a_stage_stopped_before_config_json_leaves_the_old_version_in_service(
    trnctl: Any, s3: Any, clients: Any, model_dir: Path
) -> None:
    """config.json goes up last and the manifest says complete after it: a stage of changed
    files stopped before config.json leaves v2 unusable and v1 in service; the next stage of
    the same files resumes v2, uploading only what is missing."""
    assert stage(trnctl, model_dir).exit_code == 0
    (model_dir / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 256}))
    # The claim of v2's manifest, then the 6 files before config.json.
    writes = S3Writes(clients("s3", OUTPUTS.region), stop_at=8)

    with pytest.raises(Stopped):
        stage(trnctl, model_dir)
    writes.close()

    assert writes.puts[0] == "models/tiny-llama/versions/v2.json"
    assert "models/tiny-llama/v2/config.json" not in keys(s3)
    assert registry.resolve(s3, BUCKET, "models/tiny-llama", "trn-dev").path == (
        "models/tiny-llama/v1"
    )
    with pytest.raises(TrnctlError, match=r"models/tiny-llama@v2 is still staging") as error:
        registry.resolve(s3, BUCKET, "models/tiny-llama@v2", "trn-dev")
    assert error.value.exit_code == ExitCode.NOT_FOUND
    again = stage(trnctl, model_dir)
    assert "as models/tiny-llama@v2 " in again.stdout
    assert "uploaded 1, skipped 6 already intact" in again.stdout
    assert manifest(s3, "v2")["state"] == "complete"


def test_large_weights_go_up_as_multipart_with_their_sha256(
    trnctl: Any, s3: Any, model_dir: Path
) -> None:
    for shard in model_dir.glob("model-*.safetensors"):
        shard.unlink()
    (model_dir / hf_models.WEIGHTS_INDEX_FILE).unlink()
    weights = {"w": np.zeros(1_600_000, dtype=np.float32)}  # 6.4 MB: two 5 MiB parts
    save_file(weights, str(model_dir / "model.safetensors"))

    run = stage(trnctl, model_dir, "tiny-llama", "--part-size-mib", "5")

    assert run.exit_code == 0, run.stderr
    head = s3.head_object(Bucket=BUCKET, Key="models/tiny-llama/v1/model.safetensors")
    assert head["ETag"].strip('"').endswith("-2")
    digest = hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest()
    assert head["Metadata"]["sha256"] == digest


def test_a_single_weights_file_wins_over_an_index(model_dir: Path) -> None:
    """transformers loads model.safetensors where both exist; the index and its shards stay."""
    save_file(tensors(3), str(model_dir / "model.safetensors"))

    model = models.inspect(model_dir)

    assert model.files[0] == "model.safetensors"
    assert "model.safetensors.index.json" in model.skipped
    assert "model-00001-of-00002.safetensors" in model.skipped


def test_model_type_names_the_architecture_without_architectures(model_dir: Path) -> None:
    (model_dir / "config.json").write_text(json.dumps({"model_type": "qwen2"}))

    assert models.inspect(model_dir).architecture == "Qwen2ForCausalLM"


@pytest.mark.parametrize(
    ("config", "architecture"),
    [
        ({"architectures": ["BertForMaskedLM"]}, "BertForMaskedLM"),
        ({"architectures": ["BertForSequenceClassification"]}, "BertForSequenceClassification"),
        ({"model_type": "bert"}, "BertModel"),
    ],
)
def test_a_bert_checkpoint_stages_for_classification(
    model_dir: Path, config: dict[str, Any], architecture: str
) -> None:
    (model_dir / "config.json").write_text(json.dumps(config))

    assert models.inspect(model_dir).architecture == architecture


def test_a_tokenizer_model_is_a_tokenizer(model_dir: Path) -> None:
    (model_dir / "tokenizer.json").unlink()
    (model_dir / "tokenizer.model").write_bytes(b"sentencepiece")

    assert "tokenizer.model" in models.inspect(model_dir).files


def _header(path: Path, header: bytes, data: bytes = b"", length: int | None = None) -> None:
    size = len(header) if length is None else length
    path.write_bytes(struct.pack("<Q", size) + header + data)


SHARD1 = "model-00001-of-00002.safetensors"


def _break(root: Path, case: str) -> None:
    """Damages the model directory ``root`` as ``case`` says."""
    index = root / hf_models.WEIGHTS_INDEX_FILE
    config = root / "config.json"
    if case == "no config":
        config.unlink()
    elif case == "config not json":
        config.write_text("{architectures: [")
    elif case == "config a list":
        config.write_text("[]")
    elif case == "unsupported architecture":
        config.write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    elif case == "two architectures":
        config.write_text(json.dumps({"architectures": ["LlamaForCausalLM", "Qwen2ForCausalLM"]}))
    elif case == "unsupported model_type":
        config.write_text(json.dumps({"model_type": "gpt2"}))
    elif case == "no weights":
        index.unlink()
    elif case == "index without weight_map":
        index.write_text(json.dumps({"metadata": {}}))
    elif case == "index names a missing shard":
        (root / SHARD1).unlink()
    elif case == "index leaves the directory":
        index.write_text(json.dumps({"weight_map": {"w": "../other.safetensors"}}))
    elif case == "index names an absent tensor":
        index.write_text(json.dumps({"weight_map": {"lm_head.weight": SHARD1}}))
    elif case == "shard too short":
        (root / SHARD1).write_bytes(b"abc")
    elif case == "header length too large":
        _header(root / SHARD1, b"{}", length=1 << 40)
    elif case == "header not json":
        _header(root / SHARD1, b"not json")
    elif case == "shard truncated":
        raw = (root / SHARD1).read_bytes()
        (root / SHARD1).write_bytes(raw[:-4])
    elif case == "bad data_offsets":
        _header(root / SHARD1, json.dumps({"layers.1.w0": {"dtype": "F32"}}).encode())
    elif case == "no tokenizer":
        (root / "tokenizer.json").unlink()
    else:
        raise AssertionError(case)


# What `model stage` takes, as its refusals list them.
STAGED = (
    "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, "
    "BertForSequenceClassification, BertModel, BertForPreTraining, BertForMaskedLM"
)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("no config", "{root}/config.json: missing; a Hugging Face model directory has one"),
        (
            "config not json",
            "{root}/config.json: not valid JSON (Expecting property name enclosed in double "
            "quotes: line 1 column 2 (char 1))",
        ),
        ("config a list", "{root}/config.json: not a JSON object"),
        (
            "unsupported architecture",
            "{root}/config.json: architectures ['GPT2LMHeadModel'] is not supported; allowed: "
            + STAGED,
        ),
        (
            "two architectures",
            "{root}/config.json: architectures ['LlamaForCausalLM', 'Qwen2ForCausalLM'] is not "
            "supported; allowed: " + STAGED,
        ),
        (
            "unsupported model_type",
            "{root}/config.json: no architectures, and model_type 'gpt2' is not one of llama, "
            "qwen2, qwen3, mistral, bert; allowed architectures: " + STAGED,
        ),
        (
            "no weights",
            "model directory '{root}' has neither model.safetensors nor "
            "model.safetensors.index.json (other weight formats, such as pytorch_model.bin, are "
            "not read)",
        ),
        (
            "index without weight_map",
            "{root}/model.safetensors.index.json: no weight_map object naming the file of each "
            "tensor",
        ),
        (
            "index names a missing shard",
            "{root}/model.safetensors.index.json: names model-00001-of-00002.safetensors, which "
            "is missing",
        ),
        (
            "index leaves the directory",
            "{root}/model.safetensors.index.json: weight_map maps w to '../other.safetensors'; "
            "expected a .safetensors file in the same directory",
        ),
        (
            "index names an absent tensor",
            "{root}/model.safetensors.index.json: maps lm_head.weight to "
            "model-00001-of-00002.safetensors, whose header has no such tensor",
        ),
        (
            "shard too short",
            "{root}/model-00001-of-00002.safetensors: 3 bytes, too short for a safetensors header",
        ),
        (
            "header length too large",
            "{root}/model-00001-of-00002.safetensors: header length 1099511627776 exceeds the "
            "file's remaining 2 bytes or safetensors' limit of 100000000 (not a safetensors "
            "file?)",
        ),
        (
            "header not json",
            "{root}/model-00001-of-00002.safetensors: the safetensors header is not a JSON object",
        ),
        (
            "shard truncated",
            "{root}/model-00001-of-00002.safetensors: the header describes 128 bytes of tensor "
            "data but the file holds 124 (truncated or corrupt)",
        ),
        (
            "bad data_offsets",
            "{root}/model-00001-of-00002.safetensors: tensor layers.1.w0 has no valid "
            "data_offsets [BEGIN, END]",
        ),
        (
            "no tokenizer",
            "model directory '{root}' has no tokenizer.json or tokenizer.model: the tokenizer "
            "travels with the model (prepare-data and export read it)",
        ),
    ],
)
def test_a_bad_model_directory_is_refused_before_any_upload(
    trnctl: Any, s3: Any, model_dir: Path, case: str, message: str
) -> None:
    _break(model_dir, case)

    expected = message.format(root=model_dir)
    with pytest.raises(TrnctlError, match=f"^{re.escape(expected)}$"):
        models.inspect(model_dir)
    run = stage(trnctl, model_dir)

    assert run.exit_code == ExitCode.USAGE
    assert run.stderr == f"trnctl: {expected}\n"
    assert keys(s3) == set()


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("missing", "model directory '{root}/missing' does not exist"),
        (
            "tiny-llama/config.json",
            "model directory '{root}/tiny-llama/config.json' is not a directory",
        ),
    ],
)
def test_a_missing_directory_is_refused(
    trnctl: Any, s3: Any, model_dir: Path, source: str, message: str
) -> None:
    run = stage(trnctl, model_dir.parent / source)

    assert run.exit_code == ExitCode.USAGE
    assert run.stderr == f"trnctl: {message.format(root=model_dir.parent)}\n"


@pytest.mark.parametrize("name", ["Llama-3", "-llama", "llama-", "llama_3", "a" * 64, "a/b", ""])
def test_bad_model_names_are_refused(trnctl: Any, s3: Any, model_dir: Path, name: str) -> None:
    with pytest.raises(TrnctlError, match=r"is not allowed: use lowercase letters, digits") as e:
        models.validate_name(name)
    assert e.value.exit_code == ExitCode.USAGE
    run = stage(trnctl, model_dir, name)

    assert run.exit_code == ExitCode.USAGE
    assert run.stderr == (
        f"trnctl: model name {name!r} is not allowed: use lowercase letters, digits, '-' and "
        "'.', starting and ending with a letter or digit, at most 63 characters\n"
    )
    assert keys(s3) == set()


@pytest.mark.parametrize("name", ["llama-3.1-8b-instruct", "qwen3-0.6b", "m", "a" * 63])
def test_dns_style_model_names_are_allowed(name: str) -> None:
    assert models.validate_name(name) == name


def test_unknown_env_exits_4(trnctl: Any, model_dir: Path) -> None:
    run = stage(trnctl, model_dir)

    assert run.exit_code == ExitCode.NOT_FOUND
    assert run.stderr.startswith("trnctl: unknown environment 'trn-dev'")


def test_a_transformers_model_staged_loads_back_in_transformers(
    trnctl: Any, s3: Any, tmp_path: Path
) -> None:
    """A sharded Qwen3 directory written by transformers passes the checks, and what lands in S3
    is a directory transformers loads with the same weights."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=len(TOKENIZER_WORDS),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
    )
    source = tmp_path / "qwen3-tiny"
    Qwen3ForCausalLM(config).save_pretrained(source, max_shard_size="4KB")
    write_tokenizer(source)
    assert (source / hf_models.WEIGHTS_INDEX_FILE).is_file()

    run = stage(trnctl, source, "qwen3-tiny")

    assert run.exit_code == 0, run.stderr
    assert "staged Qwen3ForCausalLM qwen3-tiny" in run.stdout
    back = tmp_path / "back"
    back.mkdir()
    for key in keys(s3, "models/qwen3-tiny/"):
        s3.download_file(BUCKET, key, str(back / key.rsplit("/", 1)[1]))
    loaded = AutoModelForCausalLM.from_pretrained(back)
    original = AutoModelForCausalLM.from_pretrained(source)
    ids = torch.tensor([[1, 3, 4, 5]])
    assert torch.equal(loaded(ids).logits, original(ids).logits)


def test_the_catalog_module_needs_only_the_standard_library() -> None:
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import trn_catalog.hf_models\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(new - set(sys.stdlib_module_names) - {'trn_catalog'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
