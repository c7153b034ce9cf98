from pofe.cli.main import main

main()
