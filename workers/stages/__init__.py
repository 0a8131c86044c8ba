"""One module per pipeline stage, each with one entry function `run`."""
