"""A session on one thread: its ops, the recorder, its tools, following and resuming turns.

May import: config, store, model, tools, turn.
"""
