"""The configuration: loading config.toml, its sections and line numbers, the plugin check.

May import: nothing of roder_runtime.
"""
