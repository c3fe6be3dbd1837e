"""Stand-in for `torchvision.io` (see the package's docstring): the names SGLang imports."""


def decode_jpeg(*args, **kwargs):
    raise NotImplementedError("kerneldev's test stand-in for torchvision cannot decode images")
