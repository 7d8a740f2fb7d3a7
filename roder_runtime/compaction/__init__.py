"""Compaction: the transactional call, automatic compaction, summaries, token estimates.

May import: model, store.
"""
