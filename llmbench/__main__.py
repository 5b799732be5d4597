from llmbench.harness.cli import main

main()
