"""The REST API (FastAPI) with the MCP server mounted at /mcp."""
