"""`python -m kerneldev` is the same as the `kerneldev` console script."""

from kerneldev.cli.entry import run

if __name__ == "__main__":
    run()
