"""kerneldev: the pull / diff / push / restart / bench loop for live inference-server kernels."""

__version__ = "0.1.0"
