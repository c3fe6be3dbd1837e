"""Run on the host after a push (`python -c`, argv[1] a JSON list of [import root, module]):
import each pushed module as the server would, its import root first on sys.path; exit 1 when
any import failed (its traceback on stderr). Standard library only."""

import importlib
import json
import os
import sys
import traceback


def main():
    failed = 0
    for root, module in json.loads(sys.argv[1]):
        if root not in sys.path:
            sys.path.insert(0, root)
        try:
            importlib.import_module(module)
            print("kerneldev: imported " + module)
        except BaseException as err:
            failed = 1
            traceback.print_exc()
            why = "%s: %s" % (type(err).__name__, err)
            sys.stderr.write("kerneldev: cannot import %s: %s\n" % (module, why))
    # os._exit, not sys.exit: the interpreter's teardown of what the modules imported (torch's
    # modules, for a kernel file) costs 0.4-1.6 CPU-s and reports nothing; the answer is out.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(failed)


if __name__ == "__main__":
    main()
