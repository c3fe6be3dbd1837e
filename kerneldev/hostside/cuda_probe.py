"""Run on a GPU host by `kerneldev doctor`, fed on stdin to its `python`: torch's own view of
CUDA (importing torch takes seconds). Prints one JSON object; standard library besides torch."""

import json


def main():
    try:
        import torch
    except Exception as err:
        print(json.dumps({"error": "%s: %s" % (type(err).__name__, err)}))
        raise SystemExit(0) from None
    n = torch.cuda.device_count() if torch.version.cuda else 0
    caps = ["%d.%d" % torch.cuda.get_device_capability(i) for i in range(n)]
    print(json.dumps({"cuda": torch.version.cuda, "devices": n, "caps": caps}))


if __name__ == "__main__":
    main()
