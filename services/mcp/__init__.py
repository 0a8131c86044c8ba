"""The MCP server: the document lifecycle for agents, over stdio and streamable HTTP."""
