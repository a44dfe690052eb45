"""``python -m stark_ray.cli``: the ``stark`` command."""

from stark_ray.cli.main import main

main()
