"""Run SGLang's own benchmark client (`sglang.benchmark.serving`) from a downloaded SGLang wheel.

kerneldev's `bench --service` is checked against the client SGLang ships (the agreement test
`tests/test_sglang_client_agreement.py` and `benchmarks/service_vs_sglang_client.py`). Installing
the whole SGLang package for that would pull CUDA wheels, so this module extracts only what the
client imports from the wheel (`sglang/benchmark/`, `sglang/srt/utils/network.py`) into a cache
folder and runs it in a fresh interpreter, with the `sglang` package's heavy `__init__` files
bypassed:

- `sglang`, `sglang.srt`, `sglang.srt.utils`, `sglang.srt.disaggregation` become plain package
  objects whose `__path__` is the extracted folder (their `__init__` imports torch, zmq servers
  and the whole runtime; the client uses none of it);
- `sglang.srt.disaggregation.utils` (torch.distributed) is replaced by a module holding the one
  name the client imports from it, `FAKE_BOOTSTRAP_HOST`, whose value is read from the wheel's
  file (an `ast` parse, nothing of it runs);
- `datasets` (Hugging Face's; only the MMMU dataset uses it) is a placeholder when it is not
  installed.

Everything else is SGLang's code as released. Its own needs (aiohttp, msgspec, numpy, orjson,
requests, tqdm, transformers, psutil, pyzmq, pybase64, pillow) are the `sglang-client` extra.
The wheel is found in `$KERNELDEV_SGLANG_WHEEL` (a path), else in the release cache
`~/.cache/kerneldev/sglang` (`$KERNELDEV_SGLANG_CACHE`) that `scripts/bootstrap test` fills.

A tokenizer is needed offline (the client loads one before it sends anything):
`write_word_tokenizer` builds a word-level one for the sandbox's vocabulary (`" t123"` tokens)
with the `tokenizers` package, and the sandbox names it in `/model_info` (`tokenizer_path`), so
the client finds it with its default start-up.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

CLIENT_VERSION = "0.5.23"  # the release whose client the agreement test runs
WHEEL_ENV = "KERNELDEV_SGLANG_WHEEL"
CACHE_ENV = "KERNELDEV_SGLANG_CACHE"
# The wheel members the client needs (prefixes), and the one file read for a constant only.
MEMBERS = ("sglang/benchmark/", "sglang/srt/utils/network.py")
DISAGG_UTILS = "sglang/srt/disaggregation/utils.py"
CLIENT_DEPS = (
    "aiohttp",
    "msgspec",
    "numpy",
    "orjson",
    "requests",
    "tqdm",
    "transformers",
    "psutil",
    "zmq",
    "pybase64",
    "PIL",
)


class ClientUnavailable(RuntimeError):
    """SGLang's client cannot run here (no wheel, a missing package); the message says which."""


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "kerneldev" / "sglang")


def find_wheel(version: str = CLIENT_VERSION) -> Path:
    given = os.environ.get(WHEEL_ENV)
    if given:
        path = Path(given)
        if not path.is_file():
            raise ClientUnavailable(f"{WHEEL_ENV}={given}: no such file")
        return path
    found = sorted(cache_dir().rglob(f"sglang-{version}-*.whl"))
    if not found:
        raise ClientUnavailable(
            f"no SGLang {version} wheel in {cache_dir()} (scripts/bootstrap test fetches it; "
            f"or set {WHEEL_ENV})"
        )
    return found[-1]


def missing_packages() -> list[str]:
    import importlib.util

    return [m for m in CLIENT_DEPS if importlib.util.find_spec(m) is None]


def extract(wheel: Path, dest: Path | None = None) -> Path:
    """The client's files from `wheel` under `dest` (default: beside the cached wheel, in a
    folder named after it); extracted once, then reused."""
    root = dest or cache_dir() / "client" / wheel.stem
    done = root / ".extracted"
    if done.is_file():
        return root
    root.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.startswith(MEMBERS) or n == DISAGG_UTILS]
        if not any(n.startswith("sglang/benchmark/serving") for n in names):
            raise ClientUnavailable(f"{wheel.name} has no sglang/benchmark/serving.py")
        for name in names:
            zf.extract(name, root)
    done.write_text(wheel.name + "\n")
    return root


def fake_bootstrap_host(root: Path) -> str:
    """FAKE_BOOTSTRAP_HOST's value in the wheel's disaggregation/utils.py (parsed, not run)."""
    tree = ast.parse((root / DISAGG_UTILS).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "FAKE_BOOTSTRAP_HOST" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise ClientUnavailable(f"{DISAGG_UTILS} has no FAKE_BOOTSTRAP_HOST")


# Runs in the client's interpreter: argv[1] = extracted root, argv[2] = FAKE_BOOTSTRAP_HOST,
# the rest = the client's own arguments.
_BOOT = r"""
import importlib.util, os, runpy, sys, types
root, fake_host = sys.argv[1], sys.argv[2]
sys.argv = ["sglang.benchmark.serving"] + sys.argv[3:]
for name in ("sglang", "sglang.srt", "sglang.srt.utils", "sglang.srt.disaggregation"):
    mod = types.ModuleType(name)
    mod.__path__ = [os.path.join(root, *name.split("."))]
    sys.modules[name] = mod
disagg = types.ModuleType("sglang.srt.disaggregation.utils")
disagg.FAKE_BOOTSTRAP_HOST = fake_host
sys.modules[disagg.__name__] = disagg
if importlib.util.find_spec("datasets") is None:
    placeholder = types.ModuleType("datasets")
    def load_dataset(*a, **k):
        raise RuntimeError("Hugging Face `datasets` is not installed here")
    placeholder.load_dataset = load_dataset
    sys.modules["datasets"] = placeholder
runpy.run_module("sglang.benchmark.serving", run_name="__main__", alter_sys=True)
"""


def client_command(root: Path, args: list[str]) -> list[str]:
    return [sys.executable, "-c", _BOOT, str(root), fake_bootstrap_host(root), *args]


def run_client(
    args: list[str], *, wheel: Path | None = None, timeout: float = 600.0, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """`python -m sglang.benchmark.serving ARGS` from the wheel; offline (HF_HUB_OFFLINE)."""
    missing = missing_packages()
    if missing:
        raise ClientUnavailable(
            "SGLang's client needs " + ", ".join(missing) + " (the `sglang-client` extra)"
        )
    root = extract(wheel or find_wheel())
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    return subprocess.run(
        client_command(root, args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
        check=False,
    )


def write_word_tokenizer(folder: Path, vocab_size: int, extra_words: int = 0) -> Path:
    """A word-level tokenizer whose tokens are the sandbox's `t0 .. t{vocab_size-1}` (split on
    whitespace), saved as a Hugging Face tokenizer folder that `AutoTokenizer` loads offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"[UNK]": 0}
    for i in range(vocab_size + extra_words):
        vocab[f"t{i}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "unk_token": "[UNK]",
                "model_max_length": 1 << 20,
                "clean_up_tokenization_spaces": False,
            }
        )
    )
    return folder
