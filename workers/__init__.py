"""mcpvisor.workers"""
