"""``python -m forge.top top|plot ...``: the commands without the ``forge`` group (env ``FORGE_TOP_*``)."""

import click

from forge.cli.common import CONTEXT_SETTINGS
from forge.top.cli import plot, top


@click.group(context_settings=CONTEXT_SETTINGS)
def main() -> None:
    """Live telemetry (top) and run plots (plot)."""


main.add_command(top)
main.add_command(plot)

if __name__ == "__main__":
    main(prog_name="python -m forge.top", auto_envvar_prefix="FORGE")
