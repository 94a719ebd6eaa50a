"""What mcpvisor's processes share to run: spawning, logs, the forkserver, bwrap argv, trust, addresses."""
