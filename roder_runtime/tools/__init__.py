"""Running tool calls: the tool step (approval, schema check, execution) and client tools.

May import: config, store.
"""
