"""Which backend the live sm_120 wrapper's entry really reaches: the host side of
`kerneldev kernels status`.

Self-contained on purpose, like `_importscan.py`: kerneldev sends this source to the host and
runs it with the host's Python, in the service's environment (`service.env_file`), from the
live tree's import root, without writing bytecode (request as JSON on stdin, answer as JSON on
stdout). It imports the live wrapper exactly as the server does (the wrapper reads its
SGLANG_SM120_* switch at import), then calls `flash_mla_with_kvcache_sm120(**kwargs)` on tiny
CPU tensors with every candidate backend intercepted; the first one reached is the answer, and
nothing is computed:

- torch: the wrapper's `_sm120_sparse_decode_fwd` (SGLang's PyTorch fallback);
- triton: `flash_mla_sparse_decode_triton`, in the kernel file and wherever the wrapper bound it
  (the Triton variant, mma or simt, is the kernel module's `_DEFAULT_VARIANT` when it has one:
  kerneldev's kernels read SGLANG_SM120_MMA_FLASHMLA at import);
- flashinfer: any `import flashinfer...` statement run during the call (SGLang imports
  FlashInfer inside the call), and any wrapper global that FlashInfer defined.

For kerneldev's own kernel file the answer also says whether its MMA variant takes the Gluon
loops with the host's Triton (`gluon`: written for one Triton release; elsewhere the Triton
loops run) and why not.

Two calls: a decode step (few tokens, at the decode head count) and a prefill-sized call (more
than 64 query tokens: SGLang 0.5.23 sends those to FlashInfer's prefill kernel, at the layer's
real head count). A wrapper that cannot be imported, or an entry that fails before reaching a
candidate, is reported with the error (`backend: null`).

One process answers many probes (a job: wrapper, kernel file, calls, and the variables that
set it apart from the others; `kernels status` sends one job per kernel site, an A/B's
preflight one per variant). It is started in the environment the jobs share, imports torch
once (3+ CPU-seconds), and runs each job in a child forked from it (`os.fork`) that sets the
job's own variables and then imports the wrapper and the kernel file itself, so they read
their switch at import as the server does; answers come back in job order, each job's error
its own (a child that dies or hangs is that job's error: exit status or signal, no answer
within `timeout` seconds). The fork reuses only torch's import, so it is taken only when the
job's own variables all start with `SGLANG_` (SGLang's settings, read by SGLang's modules,
which the child imports itself; torch, Python and the C libraries do not read them). A job
that differs in any other variable (TORCH_*, PYTORCH_*, CUDA_*, OMP_*, MKL_*, LD_*, PYTHON*,
or anything a library might read at import) runs in a fresh interpreter, as every job does
where fork is missing or fails, or torch does not import in this process. The children stay
in this process's group, so ending the group (Ctrl-C on kerneldev's side) ends them all.
Before the first fork this process's objects go to the collector's permanent generation
(`gc.freeze`), and once its answer is out it ends with `os._exit`, as its children do: the
interpreter's teardown of torch's modules is work no answer reads (0.4-1.5 CPU-seconds).

The process does not inherit SGLang's settings from the environment it was started in (the
login's or the caller's: sshd SetEnv, ~/.bashrc, pam_env, an exported shell variable): with
`clear` in the request it first unsets every variable that starts with `clear["prefix"]`
(`SGLANG_`: SGLang's settings, the wrapper's and kerneldev's kernel switches among them) and
is not in `clear["keep"]` (the ones the jobs share, which kerneldev exported for it), so a
switch the service's env file does not set is unset here too and SGLang's default applies;
a job's own variables are set on top of that. Every other variable (PYTHONPATH, CUDA_*,
LD_LIBRARY_PATH, ...: what the wrapper needs to import) stays.

Request on stdin: `{"jobs": [{"wrapper", "kernel", "calls", "env", "timeout"}...], "source",
"clear"}` (the source, to start a fresh interpreter: `python -c` keeps no file); answer
`{"answers": [...]}` on stdout's last line, each with `interpreter` ("forked" or "fresh") or
`failed` (why the job has no answer). A request without `jobs` is one job, answered in this
interpreter.
"""

import builtins
import gc
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback

KERNEL_FILE_ENTRY = "flash_mla_sparse_decode_triton"
TORCH_ENTRY = "_sm120_sparse_decode_fwd"
ENTRY = "flash_mla_with_kvcache_sm120"
FORKABLE_PREFIX = "SGLANG_"  # the only variables a forked job may set (see the docstring)
TAIL = 2000  # characters of a failed job's output kept for its reason


class Reached(BaseException):
    """Raised by an intercepted backend; a BaseException so no `except Exception` eats it."""

    def __init__(self, backend, function, variant=None):
        BaseException.__init__(self, backend)
        self.backend = backend
        self.function = function
        self.variant = variant


class _FlashInferTrap:
    """While armed, stops the call at the first `import flashinfer...` / `from flashinfer...`
    statement (replaces `builtins.__import__`, so modules imported earlier are caught too)."""

    def __init__(self):
        self.armed = False
        self.original = builtins.__import__

    def __call__(self, name, globals=None, locals=None, fromlist=(), level=0):
        if self.armed and level == 0 and name.split(".")[0] == "flashinfer":
            what = name + ("." + ",".join(fromlist) if fromlist else "")
            caller = sys._getframe(1).f_code.co_name
            raise Reached("flashinfer", what + " (imported by " + caller + ")")
        return self.original(name, globals, locals, fromlist, level)


def _flashinfer_present():
    """Where FlashInfer's sm_120 sparse MLA lives on this Python (found, not imported)."""
    import importlib.util

    spec = importlib.util.find_spec("flashinfer")
    if spec is None:
        return None
    for folder in spec.submodule_search_locations or []:
        for rel in ("mla/_sparse_mla_sm120.py", "sparse_mla_sm120.py", "sparse_mla_sm120"):
            if os.path.exists(os.path.join(folder, rel)):
                return os.path.join(folder, rel)
    return ""


def _trap(backend, function, variant_of=None):
    def intercepted(*args, **kwargs):
        variant = kwargs.get("variant") or (variant_of() if variant_of else None)
        raise Reached(backend, function, variant)

    return intercepted


def _inputs(torch, tokens, heads):
    page_size, bytes_per_token, topk = 64, 584, 8
    return dict(
        q=torch.zeros(tokens, 1, heads, 512, dtype=torch.bfloat16),
        k_cache=torch.zeros(1, page_size, 1, bytes_per_token, dtype=torch.uint8).view(
            torch.float8_e4m3fn
        ),
        indices=torch.zeros(tokens, 1, topk, dtype=torch.int32),
        topk_length=torch.full((tokens,), topk, dtype=torch.int32),
        attn_sink=torch.zeros(heads, dtype=torch.float32),
        head_dim_v=512,
        softmax_scale=512**-0.5,
        extra_k_cache=None,
        extra_indices_in_kvcache=None,
        extra_topk_length=None,
    )


def probe(request):
    answer = {"imported": False, "calls": [], "error": None, "switch": {}}
    for key in sorted(os.environ):
        if key.startswith("SGLANG_SM120_"):
            answer["switch"][key] = os.environ[key]
    try:
        import torch

        wrapper = importlib.import_module(request["wrapper"])
    except BaseException as err:  # the server would fail the same way
        answer["error"] = f"{type(err).__name__}: {err}"
        answer["traceback"] = traceback.format_exc()[-2000:]
        return answer
    answer["imported"] = True
    answer["wrapper_file"] = getattr(wrapper, "__file__", None)
    for name in ("_sm120_default_backend", "SM120_DECODE_MAX_TOKENS"):
        if isinstance(getattr(wrapper, name, None), (str, int)):
            answer[name] = getattr(wrapper, name)
    found = _flashinfer_present()
    answer["flashinfer"] = found
    entry = getattr(wrapper, ENTRY, None)
    if entry is None:
        answer["error"] = f"the wrapper defines no {ENTRY}"
        return answer

    kernel = None
    try:
        kernel = importlib.import_module(request["kernel"])
    except BaseException as err:
        answer["kernel_error"] = f"{type(err).__name__}: {err}"
    if isinstance(getattr(kernel, "HAS_GLUON", None), bool):
        # kerneldev's kernels: whether the MMA variant takes its Gluon loops with this
        # Triton (written for one release), or its Triton loops, and why
        why = getattr(kernel, "GLUON_UNAVAILABLE", None)
        answer["gluon"] = {
            "available": kernel.HAS_GLUON,
            "why_not": why if isinstance(why, str) else None,
            "triton": getattr(sys.modules.get("triton"), "__version__", None),
        }

    def variant():
        value = getattr(kernel, "_DEFAULT_VARIANT", None)
        return value if isinstance(value, str) else None

    patched = []
    for module in (wrapper, kernel):
        if module is None:
            continue
        if hasattr(module, KERNEL_FILE_ENTRY):
            patched.append((module, KERNEL_FILE_ENTRY, getattr(module, KERNEL_FILE_ENTRY)))
            setattr(
                module,
                KERNEL_FILE_ENTRY,
                _trap("triton", module.__name__ + "." + KERNEL_FILE_ENTRY, variant),
            )
    if hasattr(wrapper, TORCH_ENTRY):
        patched.append((wrapper, TORCH_ENTRY, getattr(wrapper, TORCH_ENTRY)))
        setattr(wrapper, TORCH_ENTRY, _trap("torch", wrapper.__name__ + "." + TORCH_ENTRY))
    for name, value in list(vars(wrapper).items()):
        if callable(value) and str(getattr(value, "__module__", "")).startswith("flashinfer"):
            patched.append((wrapper, name, value))
            setattr(wrapper, name, _trap("flashinfer", value.__module__ + "." + name))

    trap = _FlashInferTrap()
    builtins.__import__ = trap
    try:
        for call in request["calls"]:
            record = {"call": call["name"], "tokens": call["tokens"], "heads": call["heads"]}
            record.update(backend=None, function=None, variant=None, error=None)
            trap.armed = True
            try:
                entry(**_inputs(torch, call["tokens"], call["heads"]))
                record["error"] = "the entry returned without reaching a known backend"
            except Reached as hit:
                record.update(backend=hit.backend, function=hit.function, variant=hit.variant)
            except BaseException as err:
                record["error"] = f"{type(err).__name__}: {err}"
            finally:
                trap.armed = False
            answer["calls"].append(record)
    finally:
        builtins.__import__ = trap.original
        for module, name, value in patched:
            setattr(module, name, value)
    return answer


def forkable(env):
    """Whether a job with these variables of its own may run in a child of this process."""
    return hasattr(os, "fork") and all(key.startswith(FORKABLE_PREFIX) for key in env)


def _last_line(text):
    lines = text.strip().splitlines()
    return lines[-1] if lines else "no output"


def _ended(code):
    """How a job's process ended, from its exit code as subprocess gives it (-N: signal N)."""
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}"


def _in_fork(job, timeout):
    """The job's answer from a forked child; None when fork fails (the caller starts a fresh
    interpreter instead)."""
    try:
        log = tempfile.TemporaryFile()  # the child's stdout and stderr: a dying child's reason
    except OSError:
        return None
    read_end, write_end = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        log.close()
        return None
    if pid == 0:  # the child: never returns into the parent's loop
        status = 1
        try:
            os.close(read_end)
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            os.environ.update(job["env"])
            data = (json.dumps(probe(job)) + "\n").encode()
            while data:
                data = data[os.write(write_end, data) :]
            status = 0
        except BaseException:
            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except BaseException:
                    pass
            os._exit(status)
    os.close(write_end)
    chunks, deadline, timed_out = [], time.monotonic() + timeout, False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            if select.select([read_end], [], [], left)[0]:
                chunk = os.read(read_end, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
        if timed_out:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        log.seek(0)
        output = log.read().decode("utf-8", "replace")[-TAIL:]
    finally:
        os.close(read_end)
        log.close()
    if timed_out:
        return {"failed": f"no answer within {timeout:g}s, killed: {_last_line(output)}"}
    try:
        answer = json.loads(b"".join(chunks).decode())
    except ValueError:
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        return {"failed": f"{_ended(code)}: {_last_line(output)}", "output": output}
    answer["interpreter"] = "forked"
    return answer


def _in_fresh(job, timeout, source):
    """The job's answer from a fresh interpreter with this process's environment and the
    job's variables, as one probe ran before batching."""
    env = dict(os.environ, **job["env"], PYTHONDONTWRITEBYTECODE="1")
    single = {k: v for k, v in job.items() if k not in ("env", "timeout")}
    try:
        run = subprocess.run(
            [sys.executable, "-B", "-c", source],
            input=json.dumps(single).encode(),
            capture_output=True,
            env=env,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"failed": f"no answer within {timeout:g}s, killed"}
    except OSError as err:
        return {"failed": f"cannot start {sys.executable}: {err}"}
    try:
        answer = json.loads(_last_line(run.stdout.decode("utf-8", "replace")))
    except ValueError:
        stderr = run.stderr.decode("utf-8", "replace")
        return {
            "failed": f"{_ended(run.returncode)}: {_last_line(stderr)}",
            "output": stderr[-TAIL:],
        }
    answer["interpreter"] = "fresh"
    return answer


def probe_all(request):
    """Every job of `request`, in order (see the module's docstring)."""
    jobs, source = request["jobs"], request["source"]
    torch_here = False
    if any(forkable(job["env"]) for job in jobs):
        try:
            import torch  # noqa: F401 - what the forked children share

            torch_here = True
        except BaseException:  # each job then meets the error in its own interpreter
            pass
    if torch_here:
        # What the children inherit stays alive in them: with it in the collector's permanent
        # generation their collections skip it (and leave its pages shared) while the wrapper
        # imports. Collected first, so no garbage of this process is left for a child to free.
        gc.collect()
        gc.freeze()
    answers = []
    for job in jobs:
        timeout = job["timeout"]
        answer = _in_fork(job, timeout) if torch_here and forkable(job["env"]) else None
        answers.append(answer if answer is not None else _in_fresh(job, timeout, source))
    return {"answers": answers}


def clear_inherited(clear):
    """Unset the inherited variables named by `clear` (see the module's docstring); returns
    their names."""
    if not clear:
        return []
    keep = set(clear.get("keep") or ())
    gone = sorted(k for k in os.environ if k.startswith(clear["prefix"]) and k not in keep)
    for key in gone:
        del os.environ[key]  # unsetenv too: fresh interpreters and forked children inherit it
    return gone


def main():
    request = json.loads(sys.stdin.read())
    clear_inherited(request.get("clear"))
    sys.path.insert(0, os.getcwd())
    answer = probe_all(request) if "jobs" in request else probe(request)
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    # The answer is out and every child reaped: skip the interpreter's teardown, which frees
    # torch's (and in a fresh interpreter SGLang's) modules one by one for 0.4-1.5 CPU-s. A
    # forked child ends the same way (os._exit), so no job runs exit handlers either way.
    os._exit(0)


if __name__ == "__main__":
    main()
