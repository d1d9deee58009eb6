"""Shared test data: the shipped sample prepared once per test session (offline), and the `ablate` command run
in this process (most tests) or in a fresh one (the tests about the process boundary)."""

import contextlib
import io
import logging
import os
import subprocess
import sys
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]


def prepared_sample(root: Path) -> Path:
    """`ablate data prepare --source sample` into root/sample (a no-op when already there)."""
    from ablate.data import prepare

    return prepare("sample", root / "sample", progress_bar=False)


def ablate_cli(*args, cwd=None, env=None, check=True, timeout=600, process=False) -> subprocess.CompletedProcess:
    """Run the `ablate` command and return its exit code, stdout and stderr.

    In this process by default: `ablate.cli.main(argv)` with stdout, stderr and ablate's log lines captured, in
    `cwd` and with `env` added to the environment, both put back afterwards. Starting Python and torch again costs
    seconds a call, and a test about what a command does is not about the process it runs in. `process=True` runs
    the real command in a fresh process (what a user types): each command keeps a test that does (timeout applies
    there only)."""
    argv = list(map(str, args))
    extra = {"OMP_NUM_THREADS": "1", **(env or {})}
    result = _in_a_process(argv, cwd, extra, timeout) if process else _in_this_process(argv, cwd, extra)
    if check and result.returncode != 0:
        raise AssertionError(f"ablate {' '.join(argv)} exited {result.returncode}:\n{result.stderr[-3000:]}")
    return result


def _in_a_process(argv, cwd, extra, timeout) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **extra}
    return subprocess.run([sys.executable, "-m", "ablate.cli", *argv], cwd=cwd or REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def _in_this_process(argv, cwd, extra) -> subprocess.CompletedProcess:
    """main(argv) as the command runs it, with what it may change in this process put back: the environment, the
    working folder, torch's thread count, the arms and modules an experiment file registers, the log level."""
    import torch

    from ablate.arms import list_arms
    from ablate.arms.base import _REGISTRY
    from ablate.cli import main

    list_arms()  # the package's own arms registered first: they stay, as in a process that imported them

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd, threads = dict(os.environ), os.getcwd(), torch.get_num_threads()
    arms, modules = dict(_REGISTRY), set(sys.modules)
    root = logging.getLogger()
    handler = logging.StreamHandler(err)  # what the command's logging.basicConfig gives a fresh process
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if {"-v", "--verbose"} & set(argv) else logging.INFO)
    os.environ.update(extra)
    try:
        os.chdir(cwd or REPO)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = _exit_code(main, argv, err)
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        torch.set_num_threads(threads)
        package = {name: cls for name, cls in _REGISTRY.items() if cls.__module__.startswith("ablate.")}
        _REGISTRY.clear()
        _REGISTRY.update(arms)
        _REGISTRY.update({name: cls for name, cls in package.items() if name not in arms})  # a package module the
        # command imported (an experiment's `import ablate.arms.testbed`) stays imported: its arms stay too
        for name in set(sys.modules) - modules:
            if name.startswith("ablate_experiment_") or _user_module(sys.modules[name]):
                del sys.modules[name]  # the next command imports it again and its arms register again
        root.removeHandler(handler)
        root.setLevel(level)
    return subprocess.CompletedProcess(["ablate", *argv], code, out.getvalue(), err.getvalue())


_KEPT_ROOTS = tuple({Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), (REPO / "ablate").resolve()})


def _user_module(module) -> bool:
    """A module that an experiment or arm file imported from beside it: not the package's, the venv's or the
    standard library's (a fresh process would import it again, and its arms would register again)."""
    path = getattr(module, "__file__", None)
    return bool(path) and not any(Path(path).resolve().is_relative_to(root) for root in _KEPT_ROOTS)


def _exit_code(main, argv, err) -> int:
    """main's return value, argparse's exit, or 1 with the traceback on stderr (as an uncaught error in a process)."""
    try:
        return int(main(argv) or 0)
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            return exit_.code or 0
        err.write(f"{exit_.code}\n")  # sys.exit("message"): Python prints it and exits 1
        return 1
    except Exception:  # noqa: BLE001 (what Python prints for a command that dies of it)
        err.write(traceback.format_exc())
        return 1


def ablate_on_path(root: Path, **extra) -> dict:
    """An environment whose PATH finds `ablate` (this checkout's, through root/bin/ablate), as a user's shell."""
    shim = root / "bin" / "ablate"
    shim.parent.mkdir(exist_ok=True)
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m ablate.cli "$@"\n')
    shim.chmod(0o755)
    return {**os.environ, "PATH": f"{shim.parent}:{os.environ['PATH']}", "PYTHONPATH": str(REPO),
            "OMP_NUM_THREADS": "1", **extra}
