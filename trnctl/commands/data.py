"""`trnctl data stage|list`: training data into the environment's datasets bucket, in versions."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from trnctl import (
    aws,
    datasets,
    environment,
    transfer,
    versioning,
)
from trnctl.commands import common
from trnctl.commands.common import (
    EnvOption,
    RegionOption,
)
from trnctl.errors import ExitCode, TrnctlError

app = typer.Typer(help="Stage training data in S3, in immutable versions.", no_args_is_help=True)


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
        str,
        typer.Argument(
            help="datasets/NAME (with --env also NAME): a new immutable version "
            "datasets/NAME/vN/, then datasets/NAME/latest moves to it. Any other prefix "
            "(s3://BUCKET/PREFIX, or with --env a prefix in its bucket) is staged as it is."
        ),
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
    that are already uploaded intact. To datasets/NAME: a new version, unless one already holds
    the same data (same manifest SHA-256); `latest` moves only once every file is up."""
    # trnctl.data imports the trainer and with it torch, which only this command needs.
    from trnctl import data

    if env is not None:
        outputs = environment.lookup(env, aws.client("ssm", common.region_of(region)))
        location = transfer.S3Prefix.parse(f"s3://{outputs.datasets_bucket}/{dest.lstrip('/')}")
        region = outputs.region
    else:
        location = transfer.S3Prefix.parse(dest)
    target = datasets.stage_target(dest if env is not None else location.prefix, env is not None)
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
        digest = data.manifest_sha256(workdir)
        tokens = sum(int(s["tokens"]) for s in manifest["shards"])

        def upload(
            items: list[transfer.Upload], where: transfer.S3Prefix, marker: str
        ) -> list[transfer.Upload]:
            return common.upload(s3, items, where, part_size_mib, marker=marker)

        def items_at(where: transfer.S3Prefix) -> list[transfer.Upload]:
            return data.uploads(workdir, manifest, where)

        what = f"{len(manifest['shards'])} shards ({tokens:,} tokens, {origin})"
        if target is None:
            items = items_at(location)
            todo = upload(items, location, location.key(data.MANIFEST))
            summary = f"at {location}: uploaded {len(todo)}, skipped {len(items) - len(todo)}"
            common.console().print(
                f"staged {what} {summary} already intact; manifest sha256 {digest}", soft_wrap=True
            )
            return
        record = _version_record(source, manifest, digest, common.region_of(region))
        staged = datasets.stage_version(
            s3, location.bucket, target, record=record, items_at=items_at, upload=upload
        )
    _print_staged(staged, what, digest, env)


def _version_record(
    source: Path, manifest: dict[str, Any], digest: str, region: str
) -> dict[str, Any]:
    """What a dataset version records: its manifest's SHA-256 (its identity), tokens,
    tokenizer, shards, where it was staged from, when and by whom."""
    return {
        "content_sha256": digest,
        "manifest_sha256": digest,
        "tokens": sum(int(s["tokens"]) for s in manifest["shards"]),
        "tokenizer": str(manifest.get("tokenizer", "")),
        "shards": len(manifest["shards"]),
        "source": str(source.resolve()),
        "staged_at": versioning.now(),
        "staged_by": aws.caller_arn(region),
    }


def _print_staged(
    staged: versioning.Staged[transfer.Upload], what: str, digest: str, env: str | None
) -> None:
    version = staged.version
    if staged.reused:
        done = f"already staged as {version.path} (same manifest sha256 {digest}); no new version"
    else:
        skipped = len(staged.items) - len(staged.uploaded)
        done = (
            f"staged {what} as {version.path}: uploaded {len(staged.uploaded)}, skipped "
            f"{skipped} already intact; manifest sha256 {digest}"
        )
    newer = staged.latest if staged.latest != version.number else None
    pointer = (
        f"{version.root}/latest -> {versioning.version_label(version.number)}"
        if newer is None
        else f"{version.root}/latest stays at the newer {versioning.version_label(newer)}"
    )
    submit = f"; jobs read it as --data {version.root} or {version}" if env else ""
    common.console().print(f"{done}; {pointer}{submit}", soft_wrap=True)


@app.command("list")
def data_list(
    name: Annotated[str, typer.Argument(help="The dataset: NAME or datasets/NAME.")],
    env: EnvOption,
    region: RegionOption = None,
) -> None:
    """Show a dataset's versions: state, size, tokens, tokenizer, when and by whom staged, its
    manifest SHA-256, and which one is `latest`."""
    ref = datasets.stage_target(name, with_env=True)
    if ref is None:
        raise TrnctlError(f"{name!r} is not a dataset name; use NAME or datasets/NAME")
    outputs = common.outputs_of(env, region)
    s3 = aws.client("s3", outputs.region)
    found = versioning.records(s3, outputs.datasets_bucket, ref)
    if not found:
        raise TrnctlError(
            f"{ref.root} has no versions in s3://{outputs.datasets_bucket}/; stage one with: "
            f"{datasets.stage_command(ref, env)}",
            ExitCode.NOT_FOUND,
        )
    pointed = versioning.latest(s3, outputs.datasets_bucket, ref)
    common.console().print(_versions_table(ref, found, pointed[0] if pointed else None))


def _versions_table(
    ref: versioning.Ref, found: dict[int, dict[str, Any]], latest: int | None
) -> Table:
    table = Table(title=ref.root)
    columns = ("version", "state", "size", "tokens", "tokenizer", "staged", "by", "manifest sha256")
    for column in columns:
        table.add_column(column, overflow="fold")
    for number, record in sorted(found.items(), reverse=True):
        label = versioning.version_label(number) + (" (latest)" if number == latest else "")
        table.add_row(
            label,
            str(record.get("state", "-")),
            _size(record.get("bytes")),
            f"{int(record['tokens']):,}" if "tokens" in record else "-",
            str(record.get("tokenizer") or "-"),
            str(record.get("staged_at", "-")),
            str(record.get("staged_by", "-")),
            str(record.get("manifest_sha256", "-")),
        )
    return table


_UNITS = ("KiB", "MiB", "GiB", "TiB")


def _size(value: Any) -> str:
    """``value`` bytes in binary units; ``-`` when the record has no size."""
    if not isinstance(value, int):
        return "-"
    if value < 1024:
        return f"{value} B"
    size = float(value)
    for unit in _UNITS[:-1]:
        size /= 1024
        if size < 1024:
            return f"{size:.1f} {unit}"
    return f"{size / 1024:.1f} {_UNITS[-1]}"
