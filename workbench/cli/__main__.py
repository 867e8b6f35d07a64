"""``python -m workbench.cli``: the same as ``wb``."""

from workbench.cli import main

main()
