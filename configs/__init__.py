"""ml_collections configs (`get_config(arg)`) for the absl entry points."""
