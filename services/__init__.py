"""Ragline's fronts: the REST API, the MCP server and the `ragline` command."""
