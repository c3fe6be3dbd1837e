#!/usr/bin/env python3
"""`kerneldev bench --service` against SGLang's own client, alternating, on the sandbox service.

Does kerneldev read the same decode timings as SGLang's client (`sglang.benchmark.serving`,
release 0.5.23) on the same server? Each pair runs both clients once, in alternating order
(kerneldev first in even pairs, the client first in odd ones), against one sandbox decode
service on this machine (local transport, the SIMT kernel under the Triton interpreter on CPU,
or the real kernels on a GPU):

- kerneldev: `kerneldev bench --service --variants simt --rounds 1 ...`, which restarts the
  service, waits for health and warms up before it times (its normal flow);
- SGLang's client: `--backend sglang --dataset-name random-ids --tokenize-prompt
  --random-range-ratio 1 --max-concurrency C --warmup-requests W --flush-cache`, with its
  default start-up (the model from /v1/models, the tokenizer from /model_info), against the
  service as kerneldev left it (the env file already holds the SIMT settings, so kerneldev's
  restore needs no restart: the client times a running server, as a user would run it).

Both send the same request shape: input ids of `--input-len`, `--max-new-tokens` out, ignore_eos.
It prints per pair each client's median TPOT and TTFT and kerneldev / client, then the median
and geometric mean of the paired ratios, how often kerneldev read higher, and each client's
run-to-run spread (coefficient of variation of its per-run medians, and (max - min) / median),
with the machine's load average before and after. `--out FILE` saves it all as JSON.

The bounds this checks (issue 21): paired median ratio within 3% of 1 for TPOT and TTFT over
>= 20 pairs, kerneldev's spread at most 1.2x the client's. Needs the release laid out by
`scripts/sglang_releases.py fetch` and the `service` + `kernels` extras.

    .venv/bin/python benchmarks/service_vs_sglang_client.py --pairs 24 --out pairs.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kerneldev.config import load_config  # noqa: E402
from kerneldev.sandbox.host import SANDBOX_VARIANTS, create_sandbox  # noqa: E402
from tests import sglang_client  # noqa: E402

METRICS = ("median_tpot_ms", "median_ttft_ms", "median_itl_ms")


def kerneldev_run(config: Path, args) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "kerneldev", "--config", str(config), "bench", "--service",
         "--variants", "simt", "--concurrency", str(args.concurrency),
         "--requests", str(args.requests), "--input-len", str(args.input_len),
         "--max-new-tokens", str(args.max_new_tokens), "--rounds", "1",
         "--warmup", str(args.warmup), "--json"],
        capture_output=True, text=True, timeout=900, check=False,
        env=dict(os.environ, KERNELDEV_SSH_CONFIG="none"), cwd=ROOT,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"kerneldev bench --service failed:\n{done.stderr[-3000:]}")
    m = json.loads(done.stdout)["result"]["results"][0]["metrics"]
    return {k: m[k] for k in (*METRICS, "completed", "failed", "total_output")}


def sglang_run(port: int, args, out: Path) -> dict:
    done = sglang_client.run_client(
        ["--backend", "sglang", "--host", "127.0.0.1", "--port", str(port),
         "--dataset-name", "random-ids", "--tokenize-prompt",
         "--num-prompts", str(args.requests), "--random-input-len", str(args.input_len),
         "--random-output-len", str(args.max_new_tokens), "--random-range-ratio", "1",
         "--max-concurrency", str(args.concurrency), "--warmup-requests", str(args.warmup),
         "--flush-cache", "--output-file", str(out), "--disable-tqdm"],
        timeout=900, cwd=out.parent,
    )  # fmt: skip
    if done.returncode != 0 or not out.is_file():
        raise SystemExit(f"SGLang's client failed:\n{(done.stdout + done.stderr)[-3000:]}")
    m = json.loads(out.read_text().splitlines()[-1])
    out.unlink()
    return {
        **{k: m[k] for k in METRICS},
        "completed": m["completed"],
        "failed": args.requests - m["completed"],
        "total_output": m["total_output_tokens"],
    }


def wait_healthy(url: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} never got healthy")


def spread(values: list[float]) -> dict:
    mean = statistics.fmean(values)
    return {
        "cv": statistics.stdev(values) / mean if len(values) > 1 else None,
        "range_over_median": (max(values) - min(values)) / statistics.median(values),
    }


def summarise(pairs: list[dict]) -> dict:
    out = {}
    for key in METRICS:
        ratios = [p["kerneldev"][key] / p["sglang"][key] for p in pairs]
        kd = [p["kerneldev"][key] for p in pairs]
        sg = [p["sglang"][key] for p in pairs]
        kd_spread, sg_spread = spread(kd), spread(sg)
        out[key] = {
            "paired_ratio_median": statistics.median(ratios),
            "paired_ratio_geomean": math.exp(statistics.fmean(math.log(r) for r in ratios)),
            "paired_ratio_min": min(ratios),
            "paired_ratio_max": max(ratios),
            "kerneldev_higher": sum(r > 1 for r in ratios),
            "kerneldev_median": statistics.median(kd),
            "sglang_median": statistics.median(sg),
            "kerneldev_spread": kd_spread,
            "sglang_spread": sg_spread,
            "spread_ratio_cv": (kd_spread["cv"] / sg_spread["cv"]) if sg_spread["cv"] else None,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=24)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    try:
        sglang_client.client_paths()
    except sglang_client.ClientUnavailable as err:
        print(f"service_vs_sglang_client: {err}", file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory(prefix="kd-vs-sglang-") as tmp:
        tmp = Path(tmp)
        tokenizer = sglang_client.write_word_tokenizer(tmp / "tokenizer", vocab_size=1000)
        box = create_sandbox(tmp / "box", use_ssh=False, decode_service=True)
        try:
            env_file = box.service_dir / "service.env"
            with env_file.open("a") as f:
                f.write(f"KERNELDEV_SANDBOX_TOKENIZER={tokenizer}\n")
                for key, value in SANDBOX_VARIANTS["simt"].items():
                    f.write(f"{key}={value}\n")
            host = load_config(box.config_path).host(box.host_name)
            url = host.service.url
            port = int(url.rsplit(":", 1)[1])
            subprocess.run([str(box.service_dir / "restart.sh")], check=True, capture_output=True)
            wait_healthy(url)
            pairs = []
            for i in range(args.pairs):
                load_before = os.getloadavg()
                order = ("kerneldev", "sglang") if i % 2 == 0 else ("sglang", "kerneldev")
                pair: dict = {"pair": i + 1, "order": list(order)}
                for who in order:
                    if who == "kerneldev":
                        pair["kerneldev"] = kerneldev_run(box.config_path, args)
                    else:
                        wait_healthy(url)
                        pair["sglang"] = sglang_run(port, args, tmp / f"sglang-{i}.jsonl")
                pair["load_before"], pair["load_after"] = load_before, os.getloadavg()
                pairs.append(pair)
                kd, sg = pair["kerneldev"], pair["sglang"]
                tpot, ttft = kd["median_tpot_ms"], kd["median_ttft_ms"]
                print(
                    f"pair {i + 1:2d} ({order[0][0]}{order[1][0]}): TPOT kd {tpot:.1f}"
                    f" sgl {sg['median_tpot_ms']:.1f} ({tpot / sg['median_tpot_ms']:.3f})"
                    f"  TTFT kd {ttft:.1f} sgl {sg['median_ttft_ms']:.1f}"
                    f" ({ttft / sg['median_ttft_ms']:.3f})"
                    f"  failed {kd['failed']}/{sg['failed']}  load {load_before[0]:.2f}",
                    flush=True,
                )
        finally:
            box.close()

    summary = summarise(pairs)
    loads = [p["load_before"][0] for p in pairs] + [pairs[-1]["load_after"][0]]
    print(
        f"\n{len(pairs)} pairs; {args.requests} requests, c={args.concurrency}, "
        f"input {args.input_len}, {args.max_new_tokens} tokens, {args.warmup} warm-up"
    )
    print(
        f"1-min load average over the run: {min(loads):.2f}-{max(loads):.2f} "
        f"(median {statistics.median(loads):.2f}) on {os.cpu_count()} cores"
    )
    for key, s in summary.items():
        print(
            f"{key}: kerneldev/client paired median {s['paired_ratio_median']:.3f} "
            f"(geomean {s['paired_ratio_geomean']:.3f}, {s['paired_ratio_min']:.2f}-"
            f"{s['paired_ratio_max']:.2f}, kerneldev higher in "
            f"{s['kerneldev_higher']}/{len(pairs)})"
            f"; spread (CV) kerneldev {s['kerneldev_spread']['cv']:.3f}, client "
            f"{s['sglang_spread']['cv']:.3f} ({s['spread_ratio_cv']:.2f}x)"
        )  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({
            "settings": vars(args) | {"out": str(args.out)},
            "machine": {"cores": os.cpu_count(), "platform": platform.platform(),
                        "python": platform.python_version()},
            "pairs": pairs, "summary": summary,
        }, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
