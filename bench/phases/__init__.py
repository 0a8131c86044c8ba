"""The phases of a benchmark run, one module each, in the order the run takes them."""
