"""The world's documents: a test corpus of Debian documentation packages, built at test time."""
