from trainhouse.cli import main

main()
