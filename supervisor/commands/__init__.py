"""mcpvisor.supervisor.commands"""
