"""What both fronts (REST and MCP) share: auth, the per-process service container, the error envelope."""
