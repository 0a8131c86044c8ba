"""Fetching documents over HTTP without letting a URL reach what it must not (SSRF).

The address policy (`policy`) and the fetcher that applies it (`client`), for the worker's fetch
stage and any source that crawls.
"""
