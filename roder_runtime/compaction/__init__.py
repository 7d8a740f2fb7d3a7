"""Compaction: the transactional call, automatic compaction, summaries, token estimates."""
