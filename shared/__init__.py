"""Ragline's common package: configuration, models, errors and clients shared by services and workers."""
