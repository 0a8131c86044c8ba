"""Ragline's Celery workers: the ingestion pipeline."""
