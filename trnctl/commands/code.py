"""`trnctl code stage`: your own training code into the datasets bucket."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trnctl import aws
from trnctl import code as codes
from trnctl.commands import common
from trnctl.commands.common import EnvOption, RegionOption

app = typer.Typer(
    help="Stage your own training code in the environment's datasets bucket.",
    no_args_is_help=True,
)


@app.command("stage")
def code_stage(
    source: Annotated[
        Path, typer.Argument(help="A directory of code (hidden files and caches are left out).")
    ],
    name: Annotated[str, typer.Argument(help="The code's name: jobs take it as --code code/NAME.")],
    env: EnvOption,
    part_size_mib: Annotated[
        int, typer.Option("--part-size-mib", min=5, help="Multipart part size in MiB.")
    ] = 8,
    region: RegionOption = None,
) -> None:
    """Upload a directory to code/NAME/ in the datasets bucket (mounted at /datasets in jobs),
    then its manifest; a rerun skips files already uploaded intact."""
    codes.validate_name(name)
    code = codes.inspect(source)
    outputs = common.outputs_of(env, region)
    location = codes.prefix(outputs.datasets_bucket, name)
    items = codes.uploads(code, location)
    s3 = aws.client("s3", outputs.region)
    todo = common.upload(s3, items, location, part_size_mib, marker=location.key(codes.MANIFEST))
    s3.put_object(
        Bucket=location.bucket,
        Key=location.key(codes.MANIFEST),
        Body=codes.manifest(items, location),
        ContentType="application/json",
    )
    stale = codes.stale_keys(s3, location, items)
    console = common.console()
    skipped = f"; left out {', '.join(code.skipped)}" if code.skipped else ""
    console.print(
        f"staged {len(items)} files ({sum(item.size for item in items):,} bytes) at {location}: "
        f"uploaded {len(todo)}, skipped {len(items) - len(todo)} already intact{skipped}; run "
        f"it with: trnctl job submit --env {env} --code code/{name} -- COMMAND",
        soft_wrap=True,
    )
    if stale:
        console.print(
            f"note: {location} also holds {len(stale)} objects not in {source} (jobs see them "
            f"too): {', '.join(stale)}",
            soft_wrap=True,
        )
