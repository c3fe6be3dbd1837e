"""What is wrong and where: `kerneldev status` and `kerneldev doctor`."""
