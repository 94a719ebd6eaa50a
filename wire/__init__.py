"""mcpvisor.wire"""
