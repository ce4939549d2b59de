"""`trnctl data stage`: training data into the environment's datasets bucket."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from trnctl import (
    aws,
    environment,
    transfer,
)
from trnctl.commands import common
from trnctl.commands.common import (
    RegionOption,
)

app = typer.Typer(help="Stage training data in S3.", no_args_is_help=True)


@app.command("stage")
def data_stage(
    source: Annotated[
        Path,
        typer.Argument(
            help="A text file, a directory of *.txt files (byte tokenizer), or a directory "
            "written by `trn-train prepare-data` (staged as it is)."
        ),
    ],
    dest: Annotated[
        str, typer.Argument(help="s3://BUCKET/PREFIX, or with --env a prefix in its bucket.")
    ],
    env: Annotated[
        str | None, typer.Option("--env", help="Environment whose datasets bucket to use.")
    ] = None,
    shard_tokens: Annotated[
        int, typer.Option("--shard-tokens", min=1, help="Tokens per shard.")
    ] = 1 << 24,
    part_size_mib: Annotated[
        int, typer.Option("--part-size-mib", min=5, help="Multipart part size in MiB.")
    ] = 8,
    work_dir: Annotated[
        Path | None,
        typer.Option("--work-dir", help="Keep the shards here; default: a temporary directory."),
    ] = None,
    region: RegionOption = None,
) -> None:
    """Tokenize and shard text in the trainer's format (or take a directory `trn-train
    prepare-data` wrote, after checking every file's SHA-256) and upload it; a rerun skips files
    that are already uploaded intact."""
    # trnctl.data imports the trainer and with it torch, which only this command needs.
    from trnctl import data

    if env is not None:
        outputs = environment.lookup(env, aws.client("ssm", common.region_of(region)))
        location = transfer.S3Prefix.parse(f"s3://{outputs.datasets_bucket}/{dest.lstrip('/')}")
        region = outputs.region
    else:
        location = transfer.S3Prefix.parse(dest)
    prepared = data.is_prepared(source)
    origin = "prepared" if prepared else f"{len(data.source_files(source))} files"
    s3 = aws.client("s3", common.region_of(region))
    with tempfile.TemporaryDirectory(prefix="trnctl-stage-") as scratch:
        workdir = source if prepared else (work_dir or Path(scratch))
        manifest = (
            data.check_prepared(source)
            if prepared
            else data.build_shards(source, workdir, shard_tokens=shard_tokens)
        )
        items = data.uploads(workdir, manifest, location)
        digest = data.manifest_sha256(workdir)
        todo = common.upload(s3, items, location, part_size_mib, marker=location.key(data.MANIFEST))
    tokens = sum(int(s["tokens"]) for s in manifest["shards"])
    common.console().print(
        f"staged {len(manifest['shards'])} shards ({tokens:,} tokens, {origin}) at "
        f"{location}: uploaded {len(todo)}, skipped {len(items) - len(todo)} "
        f"already intact; manifest sha256 {digest}",
        soft_wrap=True,
    )
