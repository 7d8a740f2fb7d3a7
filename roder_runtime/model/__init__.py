"""Calling an engine: the model catalog, one model call and its retries, ids, closing streams.

May import: config.
"""
