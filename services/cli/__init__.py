"""Command-line interface of Ragline."""
