from mcpvisor.supervisor.cli import main

main()
