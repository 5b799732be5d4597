"""`python -m llmbench`: the same as the `llmbench` command."""

from llmbench.cli.main import main

main()
