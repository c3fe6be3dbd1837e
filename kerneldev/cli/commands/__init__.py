"""One module per command group, registered by `kerneldev.cli.main`."""
