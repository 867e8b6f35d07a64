from engine.router.cli import main

main()
