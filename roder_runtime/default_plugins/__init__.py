"""Plugins that ship with Roder and register through the same hooks as third-party ones.

May import: nothing of roder_runtime.
"""
