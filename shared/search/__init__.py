"""OpenSearch access: client, index schema and hybrid search."""
