from paralela.cli import main

main()
