"""Run SGLang's own benchmark client (`sglang.benchmark.serving`) from a fetched SGLang release.

kerneldev's `bench --service` is checked against the client SGLang ships (the agreement test
`tests/test_sglang_client_agreement.py` and `benchmarks/service_vs_sglang_client.py`).
`scripts/sglang_releases.py` (run by `scripts/bootstrap test`) lays out the 0.5.23 release's
Python package and installs the client's imports as the package sets 'wrapper-imports' and
'benchmark-client'; installing SGLang itself would pull CUDA wheels and run its runtime's
imports. So the client runs in a fresh interpreter over the laid-out tree with those sets on
its path and the `sglang` package's heavy `__init__` files bypassed:

- `sglang`, `sglang.srt`, `sglang.srt.utils`, `sglang.srt.disaggregation` become plain package
  objects whose `__path__` is the release's folder (their `__init__` imports torch, zmq servers
  and the whole runtime; the client uses none of it);
- `sglang.srt.disaggregation.utils` (torch.distributed) is replaced by a module holding the one
  name the client imports from it, `FAKE_BOOTSTRAP_HOST`, whose value is read from the
  release's file (an `ast` parse, nothing of it runs);
- `datasets` (Hugging Face's; only the MMMU dataset uses it) is a placeholder.

Everything else is SGLang's code as released, nothing of it in this repository. The client
loads a tokenizer before it sends anything: `write_word_tokenizer` builds a word-level one for
the sandbox's vocabulary (`" t123"` tokens) with the `tokenizers` package (in the client's
environment), and the sandbox names it in `/model_info` (`tokenizer_path`), so the client finds
it with its default start-up, offline.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

CLIENT_VERSION = "0.5.23"  # the release whose client the agreement test runs
PACKAGE_SETS = ("benchmark-client", "wrapper-imports")
DISAGG_UTILS = "sglang/srt/disaggregation/utils.py"
_RELEASES_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "sglang_releases.py"


class ClientUnavailable(RuntimeError):
    """SGLang's client cannot run here (release or package sets not fetched); says which."""


def _releases():
    spec = importlib.util.spec_from_file_location("sglang_releases", _RELEASES_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def client_paths(version: str = CLIENT_VERSION) -> tuple[Path, list[Path]]:
    """The release's python/ folder and the package-set folders, or ClientUnavailable."""
    rel = _releases()
    root = rel.release_root(version) / "python"
    sets = [rel.package_dir(name) for name in PACKAGE_SETS]
    gaps = [str(p) for p in [root / "sglang" / "benchmark" / "serving.py", *sets] if not p.exists()]
    if gaps:
        raise ClientUnavailable(
            "SGLang's client is not fetched (scripts/sglang_releases.py fetch): missing "
            + ", ".join(gaps)
        )
    return root, sets


def fake_bootstrap_host(root: Path) -> str:
    """FAKE_BOOTSTRAP_HOST's value in the release's disaggregation/utils.py (parsed, not run)."""
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
import os, runpy, sys, types
root, fake_host = sys.argv[1], sys.argv[2]
sys.argv = ["sglang.benchmark.serving"] + sys.argv[3:]
for name in ("sglang", "sglang.srt", "sglang.srt.utils", "sglang.srt.disaggregation"):
    mod = types.ModuleType(name)
    mod.__path__ = [os.path.join(root, *name.split("."))]
    sys.modules[name] = mod
disagg = types.ModuleType("sglang.srt.disaggregation.utils")
disagg.FAKE_BOOTSTRAP_HOST = fake_host
sys.modules[disagg.__name__] = disagg
placeholder = types.ModuleType("datasets")  # Hugging Face's: only the MMMU dataset uses it
def load_dataset(*a, **k):
    raise RuntimeError("Hugging Face `datasets` is not installed here")
placeholder.load_dataset = load_dataset
sys.modules["datasets"] = placeholder
runpy.run_module("sglang.benchmark.serving", run_name="__main__", alter_sys=True)
"""


def client_env(sets: list[Path]) -> dict[str, str]:
    path = os.pathsep.join([*map(str, sets), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return dict(
        os.environ,
        PYTHONPATH=path,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )


def client_command(root: Path, args: list[str]) -> list[str]:
    return [sys.executable, "-c", _BOOT, str(root), fake_bootstrap_host(root), *args]


def run_client(
    args: list[str], *, timeout: float = 600.0, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """`python -m sglang.benchmark.serving ARGS` from the fetched release, offline."""
    root, sets = client_paths()
    return subprocess.run(
        client_command(root, args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=client_env(sets),
        cwd=cwd,
        check=False,
    )


_TOKENIZER = r"""
import json, sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
folder, size = sys.argv[1], int(sys.argv[2])
vocab = {"[UNK]": 0}
for i in range(size):
    vocab["t%d" % i] = len(vocab)
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins the words with spaces
tok.save(folder + "/tokenizer.json")
config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]",
          "model_max_length": 1 << 20, "clean_up_tokenization_spaces": False}
open(folder + "/tokenizer_config.json", "w").write(json.dumps(config))
"""


def write_word_tokenizer(folder: Path, vocab_size: int) -> Path:
    """A word-level tokenizer whose tokens are the sandbox's `t0 .. t{vocab_size-1}` (split on
    whitespace), saved as a Hugging Face tokenizer folder that `AutoTokenizer` loads offline;
    built in the client's environment (its `tokenizers`)."""
    _, sets = client_paths()
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-c", _TOKENIZER, str(folder), str(vocab_size)],
        capture_output=True,
        text=True,
        env=client_env(sets),
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise ClientUnavailable(f"building the tokenizer failed: {done.stderr.strip()[-500:]}")
    return folder
