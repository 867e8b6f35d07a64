from engine.router.app import main

main()
