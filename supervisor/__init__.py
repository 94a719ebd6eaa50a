"""mcpvisor.supervisor"""
