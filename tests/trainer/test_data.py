import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import two_ranks as two_ranks_launch
from two_ranks import TwoRanks

from trainer import data, parallel
from trainer.loop import open_dataset_per_node


@pytest.fixture()
def numbered(tmp_path: Path) -> Path:
    return two_ranks_launch.write_numbered(tmp_path)


def test_manifest_and_uint32_for_large_vocabularies(numbered: Path) -> None:
    ds = data.open_dataset(numbered)
    assert ds.names == ("shard_00000.bin", "shard_00001.bin")
    assert ds.num_tokens == 3000
    assert ds.shards[0].dtype == np.dtype("<u4")


def test_windows_are_contiguous_and_never_cross_shards(numbered: Path) -> None:
    sampler = data.WindowSampler(data.open_dataset(numbered), seq_len=64, micro_batch=16, seed=1)
    for step in range(20):
        x, y = sampler.batch(step)
        assert x.shape == y.shape == (16, 64) and x.dtype == torch.int64
        assert torch.equal(y, x + 1)  # targets are the next tokens
        first, last = x[:, 0], y[:, -1]
        assert bool(((first < 2000) == (last < 2000)).all())


def test_sampling_is_a_pure_function_of_seed_and_step(numbered: Path) -> None:
    ds = data.open_dataset(numbered)
    a = data.WindowSampler(ds, seq_len=32, micro_batch=4, seed=7)
    b = data.WindowSampler(ds, seq_len=32, micro_batch=4, seed=7)
    assert torch.equal(a.batch(5)[0], b.batch(5)[0])
    assert not torch.equal(a.batch(5)[0], a.batch(6)[0])


_BATCHES = """
import hashlib, sys
from trainer import data
sampler = data.WindowSampler(
    data.open_dataset(sys.argv[1]), seq_len=32, micro_batch=4, seed=7, rank=1, world_size=2
)
digest = hashlib.sha256()
for step in range(8):
    digest.update(sampler.batch(step)[0].numpy().tobytes())
print(digest.hexdigest())
"""


@pytest.mark.slow
def test_sampling_is_the_same_in_processes_of_other_hash_seeds(numbered: Path) -> None:
    """torchrun starts each rank as a new interpreter with its own str hash seed (the warm test
    processes share one): a sampler that leaned on hash() or set order would give the ranks
    different batches. Two new interpreters of fixed, different seeds draw what this one does."""
    sampler = data.WindowSampler(
        data.open_dataset(numbered), seq_len=32, micro_batch=4, seed=7, rank=1, world_size=2
    )
    here = hashlib.sha256(b"".join(sampler.batch(s)[0].numpy().tobytes() for s in range(8)))
    digests = []
    for hash_seed in ("1", "2"):
        done = subprocess.run(
            [sys.executable, "-c", _BATCHES, str(numbered)],
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        digests.append(done.stdout.strip())
    assert digests == [here.hexdigest()] * 2


def test_ranks_and_micro_steps_split_the_same_global_batch(numbered: Path) -> None:
    ds = data.open_dataset(numbered)
    whole = data.WindowSampler(ds, seq_len=32, micro_batch=8, seed=3).batch(2)[0]
    ranks = [
        data.WindowSampler(ds, seq_len=32, micro_batch=4, seed=3, rank=r, world_size=2)
        for r in (0, 1)
    ]
    accumulating = data.WindowSampler(ds, seq_len=32, micro_batch=4, seed=3, grad_accum=2)
    assert torch.equal(torch.cat([s.batch(2)[0] for s in ranks]), whole)
    assert torch.equal(torch.cat([accumulating.batch(2, m)[0] for m in (0, 1)]), whole)


def test_corrupt_shard_is_named(numbered: Path) -> None:
    shard = numbered / "shard_00001.bin"
    raw = bytearray(shard.read_bytes())
    raw[100] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with pytest.raises(data.ShardError, match=r"shard_00001\.bin: checksum mismatch") as info:
        data.open_dataset(numbered)
    assert info.value.shard.endswith("shard_00001.bin")


def test_bad_header_and_truncation_are_named(numbered: Path) -> None:
    shard = numbered / "shard_00000.bin"
    raw = shard.read_bytes()
    shard.write_bytes(b"NOTASHRD" + raw[8:])
    with pytest.raises(data.ShardError, match=r"shard_00000\.bin: bad header"):
        data.open_dataset(numbered)
    shard.write_bytes(raw[:-10])
    with pytest.raises(data.ShardError, match=r"shard_00000\.bin: holds"):
        data.open_dataset(numbered)


def test_corpus_is_byte_tokenized(corpus_dir: Path) -> None:
    ds = data.open_dataset(corpus_dir)
    assert ds.tokenizer == data.BYTE_TOKENIZER and ds.vocab_size == 256
    text = bytes(np.asarray(ds.shards[0][:6], dtype=np.uint8)).decode()
    assert text == "Tale 1"


def test_token_that_does_not_fit_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="token id 70000 does not fit uint16"):
        data.write_shard(tmp_path / "s.bin", np.array([70_000]), np.dtype("<u2"))


def test_the_dataset_carries_its_manifest_sha256(numbered: Path) -> None:
    manifest = numbered / data.MANIFEST
    first = data.open_dataset(numbered).manifest_sha256
    assert first == hashlib.sha256(manifest.read_bytes()).hexdigest()
    manifest.write_text(manifest.read_text().replace('"tokenizer": "test"', '"tokenizer": "t2"'))
    assert data.open_dataset(numbered).manifest_sha256 != first


def test_training_checks_headers_and_sizes_and_hashes_only_on_request(
    numbered: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shards were hashed when staged: a restart reads 32 bytes and a size per shard, not the
    whole dataset, unless asked to (``--verify-data``)."""
    hashed: list[str] = []
    real = data._sha256

    def counting(path: Path) -> str:
        hashed.append(path.name)
        return str(real(path))

    monkeypatch.setattr(data, "_sha256", counting)
    one = parallel.Ranks()

    assert open_dataset_per_node(str(numbered), one, None, verify=False).num_tokens == 3000
    assert hashed == []
    open_dataset_per_node(str(numbered), one, None, verify=True)
    assert hashed == ["shard_00000.bin", "shard_00001.bin"]

    shard = numbered / "shard_00001.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(data.ShardError, match=r"shard_00001\.bin: holds"):
        open_dataset_per_node(str(numbered), one, None, verify=False)


@pytest.mark.xdist_group(two_ranks_launch.GROUP)
def test_a_short_shard_on_one_rank_stops_every_rank(two_ranks: TwoRanks) -> None:
    """Without a full re-hash each rank checks headers and sizes itself, and the ranks still
    agree: a shard that is short where one rank reads it stops the other at once too, instead
    of leaving it in a collective until the timeout. Rank 0 opens the whole dataset, rank 1 a
    copy with a short shard (tests/trainer/two_ranks.py, job "short")."""
    numbered = two_ranks.numbered
    first, second = two_ranks.results("short")
    assert first == {
        "error": f"shard {numbered}: failed its checks on another rank (see that rank's log)"
    }
    assert "shard_00001.bin: holds" in second["error"]
