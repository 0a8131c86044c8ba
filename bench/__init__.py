"""`make bench`: throughput, latency, quality and memory, each next to its baseline from the same run."""
