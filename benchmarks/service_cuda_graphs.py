#!/usr/bin/env python3
"""`kerneldev bench --service` SIMT vs MMA on the sandbox's decode service, with and without
CUDA graphs (on a GPU machine; kerneldev and the `service` extra importable).

The sandbox (local transport) serves the bundled kernel file (`kernels/flash_mla_sm120_triton.py`
of this checkout: name its commit with the numbers) at the contract's production decode shape
(8 layers, H 64, topk 128 + extra 512). Two A/Bs, each its own `bench --service` run:

    graphs   variants simt, mma: CUDA graphs for SGLang's decode batch sizes up to 128
             (the sandbox's default --cuda-graph-max-bs: SGLang's 256 for an H200, capped at
             the 128 running requests), a batch padded to the next captured size
    eager    variants simt-eager, mma-eager: KERNELDEV_SANDBOX_DISABLE_CUDA_GRAPH=1

Each prints kerneldev's table; at the end one line per concurrency: median TPOT and TTFT of
each variant and mma / simt, for both modes. `--out DIR` keeps both result JSONs and the
service log there.

    python3 benchmarks/service_cuda_graphs.py --concurrency 1,16,64 --requests 64 \\
        --max-new-tokens 32 --rounds 2 --out results/
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kerneldev.sandbox.host import SANDBOX_VARIANTS, create_sandbox  # noqa: E402
from kerneldev.sandbox.service.engine import DISABLE_GRAPH_ENV  # noqa: E402

MODES = {
    "graphs": {"simt": "0", "mma": "0"},
    "eager": {"simt-eager": "1", "mma-eager": "1"},
}


def add_variants(config: Path) -> None:
    data = yaml.safe_load(config.read_text())
    for host in data["hosts"].values():
        variants = host["service"]["variants"]
        for mode in MODES.values():
            for name, disable in mode.items():
                base = dict(SANDBOX_VARIANTS[name.split("-")[0]])
                variants[name] = {**base, DISABLE_GRAPH_ENV: disable}
    config.write_text(yaml.safe_dump(data, sort_keys=False))


def bench(config: Path, variants: list[str], args) -> dict:
    command = [
        sys.executable, "-m", "kerneldev", "--config", str(config), "bench", "--service",
        "--variants", ",".join(variants), "--concurrency", args.concurrency,
        "--requests", str(args.requests), "--input-len", str(args.input_len),
        "--max-new-tokens", str(args.max_new_tokens), "--rounds", str(args.rounds), "--json",
    ]  # fmt: skip
    start = time.monotonic()
    done = subprocess.run(
        command, capture_output=True, text=True, check=False, cwd=ROOT,
        env=dict(os.environ, KERNELDEV_SSH_CONFIG="none"),
    )  # fmt: skip
    print(f"{' '.join(variants)}: exit {done.returncode} in {time.monotonic() - start:.0f} s")
    if done.returncode not in (0, 1):
        print(done.stderr[-4000:])
        raise SystemExit(1)
    return json.loads(done.stdout)["result"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", default="1,16,64")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--modes", default="graphs,eager")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory(prefix="kd-graphs-") as tmp:
        box = create_sandbox(Path(tmp) / "box", use_ssh=False, decode_service=True)
        try:
            add_variants(box.config_path)
            for mode in args.modes.split(","):
                results[mode] = bench(box.config_path, list(MODES[mode]), args)
                if args.out:
                    args.out.mkdir(parents=True, exist_ok=True)
                    (args.out / f"{mode}.json").write_text(json.dumps(results[mode], indent=1))
        finally:
            box.close()
            if args.out:
                shutil.copy(box.service_dir / "service.log", args.out / "service.log")
    print(f"\n{'mode':7} {'c':>3}  TPOT simt / mma ms (mma/simt)   TTFT simt / mma ms (mma/simt)")
    for mode, data in results.items():
        a, b = list(MODES[mode])
        for ab in data["ab"]:
            t, f = ab["metrics"]["median_tpot_ms"], ab["metrics"]["median_ttft_ms"]
            print(
                f"{mode:7} {ab['concurrency']:3d}  {t['a']:7.2f} / {t['b']:7.2f}"
                f" ({t['ratio']:.2f}x)   {f['a']:8.2f} / {f['b']:8.2f} ({f['ratio']:.2f}x)"
                f"  [{t['verdict']}]"
            )
        server = data.get("server", {}).get(a, {}).get("settings", {})
        print(f"        {a}: cuda graphs {server.get('cuda_graph_bs_decode')}")
        for d in data.get("server_differences", []):
            print(f"        differs: {d['setting']}: {d['values']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
