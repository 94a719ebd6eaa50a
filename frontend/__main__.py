from mcpvisor.frontend.main import entry

entry()
