"""Entry point of the trnctl console script (commands are added in trnctl's modules)."""

import typer

app = typer.Typer(help="Operate a Trainium training platform: preflight, capacity, data, cost.")


def main() -> None:
    app()
