"""Stand-in for torchvision in the test host's environment only (never in a live tree).

SGLang's `sglang.srt.utils` imports `torchvision.io.decode_jpeg` at module level, so importing
either release's sm_120 wrapper needs torchvision. PyPI's Linux torchvision wheel is a CUDA build
(its `_C.so` links libtorch_cuda and libcudart) and fails to load next to a CPU torch; the CPU
build lives only on PyTorch's own index. The wrapper never calls torchvision, so the tests put
this folder on the host's PYTHONPATH (tests/sglang_releases.py) instead of a wheel.
"""

__version__ = "0.0+kerneldev.stub"
