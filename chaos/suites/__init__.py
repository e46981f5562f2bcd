"""Bundled chaos suites: pytest modules run by ``pytest-reshard SUITE``."""
