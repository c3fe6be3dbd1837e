"""The command line: thin typer commands over the core library."""
