"""``python -m forge.app.top top|plot ...``: the commands without the ``forge`` group (env ``FORGE_TOP_*``)."""

import click

from forge.app.top.cli import plot, top
from forge.cli.common import CONTEXT_SETTINGS


@click.group(context_settings=CONTEXT_SETTINGS)
def main() -> None:
    """Live telemetry (top) and run plots (plot)."""


main.add_command(top)
main.add_command(plot)

if __name__ == "__main__":
    main(prog_name="python -m forge.app.top", auto_envvar_prefix="FORGE")
