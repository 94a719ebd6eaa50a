"""State that outlives a process: SQLite (default) and PostgreSQL (replicas)."""
