"""pytest-reshard: prove that distributed PyTorch training survives resharding."""
