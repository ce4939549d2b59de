"""`trnctl model stage`: Hugging Face model directories into the datasets bucket."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trnctl import (
    aws,
    models,
)
from trnctl.commands import common
from trnctl.commands.common import (
    EnvOption,
    RegionOption,
)

app = typer.Typer(
    help="Stage Hugging Face models in the environment's datasets bucket.", no_args_is_help=True
)


@app.command("stage")
def model_stage(
    source: Annotated[
        Path,
        typer.Argument(
            help="A Hugging Face model directory: config.json, safetensors weights, tokenizer."
        ),
    ],
    name: Annotated[
        str, typer.Argument(help="The model's name: jobs take it as --model models/NAME.")
    ],
    env: EnvOption,
    part_size_mib: Annotated[
        int, typer.Option("--part-size-mib", min=5, help="Multipart part size in MiB.")
    ] = 8,
    region: RegionOption = None,
) -> None:
    """Check a model directory and upload it to models/NAME/ in the datasets bucket (mounted at
    /datasets in jobs); a rerun skips files already uploaded intact."""
    models.validate_name(name)
    model = models.inspect(source)
    outputs = common.outputs_of(env, region)
    location = models.prefix(outputs.datasets_bucket, name)
    items = models.uploads(model, location)
    todo = common.upload(
        aws.client("s3", outputs.region),
        items,
        location,
        part_size_mib,
        marker=location.key(models.AREA.last_file),
    )
    skipped = f"; left out {', '.join(model.skipped)}" if model.skipped else ""
    common.console().print(
        f"staged {model.architecture} {name} ({len(items)} files, "
        f"{sum(item.size for item in items):,} bytes) at {location}: uploaded {len(todo)}, "
        f"skipped {len(items) - len(todo)} already intact{skipped}; submit with: trnctl job "
        f"submit --env {env} --model models/{name} --data ...",
        soft_wrap=True,
    )
