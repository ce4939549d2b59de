"""``python3 -m trnctl``: the CLI, as a pipeline's CronJob runs it in the platform image."""

from trnctl.cli import app

app(prog_name="trnctl")
