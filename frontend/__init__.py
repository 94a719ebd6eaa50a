"""mcpvisor.frontend"""
