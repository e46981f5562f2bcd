"""Chaos injectors (installed as ``pytest_reshard.chaos``)."""
