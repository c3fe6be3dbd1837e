"""Scripts run on the host with the standard library only."""
