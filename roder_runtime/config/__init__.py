"""The configuration: config.toml, its sections and lines, checked against the plugins."""
