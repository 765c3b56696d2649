from lucebench.cli import main

main()
