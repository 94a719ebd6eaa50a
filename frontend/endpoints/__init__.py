"""Who talks to the frontend: the HTTP app, its MCP endpoints and short paths, and the operator's channel."""
