from llmbench.cli.main import main

main()
