"""The thread store as the runtime reaches it: the bounded journal, opening it, observers.

May import: nothing of roder_runtime.
"""
