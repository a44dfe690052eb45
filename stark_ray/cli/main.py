"""``stark``: every command registered on the app, in the order its help lists them; the entry point."""

from __future__ import annotations

import importlib
import sys

import typer

from stark_ray.cli.app import app, plain_flags

# the modules whose commands the app gets, in the order of its help (each registers its own on import)
COMMANDS = ("optimize", "eval", "doctor", "campaign", "analysis", "compact")
for _name in COMMANDS:
    importlib.import_module(f"stark_ray.cli.{_name}")


def main() -> None:
    try:
        plain_flags(typer.main.get_command(app))(prog_name="stark")
    except KeyboardInterrupt:  # pragma: no cover - interactive
        sys.exit(130)


if __name__ == "__main__":
    main()
