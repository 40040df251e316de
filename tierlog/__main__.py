from tierlog.cli.main import main

main()
