"""The workers' side of sources: a connector per source type, the sync engine and the run claimer."""
