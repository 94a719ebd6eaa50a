"""The built-in tools of the MCP endpoints: search, the call variants, proxy, management, code execution."""
