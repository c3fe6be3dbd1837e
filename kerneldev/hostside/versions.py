"""Run on the host by `kerneldev doctor`, fed on stdin to its `python`: the versions of Python,
torch and triton, without importing torch or triton (which would take seconds and need a GPU for
nothing here). Prints one JSON object. Python 3.6-compatible, standard library only."""

import json
import platform
import sys


def main():
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # before Python 3.8: present or not, without a version
        version = None
        import imp
    out = {"python": platform.python_version(), "executable": sys.executable}
    for name in ("torch", "triton"):
        found = None
        if version is not None:
            try:
                found = version(name)
            except PackageNotFoundError:
                pass
        else:
            try:
                imp.find_module(name)
                found = "(version unknown)"
            except ImportError:
                pass
        out[name] = found
    print(json.dumps(out))


if __name__ == "__main__":
    main()
