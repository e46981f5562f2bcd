"""pytest plugin (placeholder while the harness is built)."""
