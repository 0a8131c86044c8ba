"""Sources: where a knowledge base's documents live (a folder, a bucket, a site, a repository), in sync."""
