"""Plugins that ship with Roder and register through the same hooks as third-party ones."""
