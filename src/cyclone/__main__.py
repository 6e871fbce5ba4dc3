"""``python -m cyclone``: the command line (see cyclone.cli)."""

from cyclone.cli import main

main()
