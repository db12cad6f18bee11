"""Runtime half of the probe: wrap sglang methods in NVTX ranges as their modules are imported.

Runs inside sglang's processes (started by site/sitecustomize.py when KIT_PROBE=1). An import hook
(a meta-path finder placed first) hands each target module a loader that executes the module as
usual and then replaces the target methods on their classes with wrappers, before any instance
exists — which matters: MultiPlatformOp binds Indexer.forward_cuda per instance at __init__.

Every wrapper keeps per-thread state, so the ranges nest the same way in eager and CUDA-graph mode:
exactly one `draft_round` per round (see kit.probe.targets for the rules and why).

Which targets: the set the release registry names for the installed sglang's version (read from its
dist-info, never by importing it); a release the registry does not know is refused with every set's
report. The first process checks and chooses; its children inherit the choice through the environment.

A control run (KIT_PROBE_TARGET_TOPK=last) also wraps kit.probe.targets.OVERRIDE_TARGETS with the
wrappers of kit.probe.override.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import json
import os
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from kit.errors import ProbeError, ProbeRefused
from kit.probe import (
    ENV_CENSUS,
    ENV_ENABLE,
    ENV_PROFILE_DEVICE,
    ENV_PROFILE_FROM,
    ENV_RECORDER,
    ENV_SINK,
    ENV_TARGET_SET,
    ENV_TARGET_TOPK,
    ENV_VERIFIED,
    TARGET_TOPK_MODES,
    override,
)
from kit.probe import ranges as nr
from kit.probe.targets import BY_MODULE, OVERRIDE_TARGETS, TARGETS, Target, by_module, target_set

MARK = "__kit_probe_target__"  # set on every wrapper: the Target it wraps


class _State(threading.local):
    def __init__(self) -> None:
        self.open: set[str] = set()  # plain ranges open on this thread
        self.round = False  # inside a draft round (eager, replayed or captured)
        self.step = False
        self.capture = False
        self.census: list[list[int]] | None = None  # capture only: indexer calls per step, per draft_forward
        self.depth = 0  # probe ranges open on this thread


_tls = _State()
_active: dict[str, tuple[Target, ...]] = BY_MODULE  # what install() wraps, by module
_profiler_started = False
_census_path: str | None = None
_flush_each = False  # recorder sink: flush after every outermost range (children never run atexit)


def _never() -> bool:
    return False


# torch.compiler.is_compiling once torch is loaded: dynamo folds it to True while tracing, so code that
# sglang compiles (the tc_piecewise prefill graph) traces straight through a wrapper, with no range and
# no graph break (checked with torch.compile(fullgraph=True)).
_compiling: Callable[[], bool] = _never


class _Range:
    """A probe range; with the recorder sink, the outermost one flushes to SQLite when it closes."""

    __slots__ = ("_cm",)

    def __init__(self, name: str):
        self._cm = nr.annotate(name)

    def __enter__(self) -> None:
        _tls.depth += 1
        self._cm.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._cm.__exit__(*exc)
        _tls.depth -= 1
        if _flush_each and _tls.depth == 0:
            nr.flush()


# ---------------------------------------------------------------------------------------------------
# Wrappers, one per kind (see kit.probe.targets)


def _plain(fn: Callable, t: Target) -> Callable:
    if t.mark is not None:
        return _mark(fn, t)
    name, is_indexer = t.range, t.range == nr.INDEXER

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _compiling():
            return fn(*args, **kwargs)
        st = _tls
        if name in st.open:  # e.g. forward_indexer called from forward_cuda: one indexer call
            return fn(*args, **kwargs)
        if is_indexer and st.census is not None and st.census and st.census[-1]:
            st.census[-1][-1] += 1
        st.open.add(name)
        try:
            with _Range(name):
                return fn(*args, **kwargs)
        finally:
            st.open.discard(name)

    return wrapper


def _mark(fn: Callable, t: Target) -> Callable:
    """A zero-length range before or after the call (the window's edges; the call may start or stop
    collection, and a range around it would then be cut off or missing)."""
    name, before = t.range, t.mark == "before"

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if before:
            with _Range(name):
                pass
            return fn(*args, **kwargs)
        out = fn(*args, **kwargs)
        with _Range(name):
            pass
        return out

    return wrapper


def _round(fn: Callable, t: Target) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _compiling():
            return fn(*args, **kwargs)
        st = _tls
        if st.round:  # already inside this round (another entry point): never a second range
            return fn(*args, **kwargs)
        st.round = True
        try:
            if st.capture:  # draft_forward run by a graph capture: capture-time work, not a round
                if st.census is not None:
                    st.census.append([])
                return fn(*args, **kwargs)
            with _Range(nr.ROUND):
                return fn(*args, **kwargs)
        finally:
            st.round = False

    return wrapper


def _step(fn: Callable, t: Target) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _compiling():
            return fn(*args, **kwargs)
        st = _tls
        if not st.round or st.step:  # target forward, draft extend, or a nested call
            return fn(*args, **kwargs)
        st.step = True
        if st.census is not None and st.census:
            st.census[-1].append(0)
        try:
            with _Range(nr.STEP):
                return fn(*args, **kwargs)
        finally:
            st.step = False

    return wrapper


def _capture(fn: Callable, t: Target) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _compiling():
            return fn(*args, **kwargs)
        st = _tls
        if st.capture:
            return fn(*args, **kwargs)
        if t.starts_profiler:
            _maybe_start_profiler()
        st.capture = True
        st.census = [] if _census_path else None
        try:
            with _Range(nr.GRAPH_CAPTURE):
                return fn(*args, **kwargs)
        finally:
            census, st.census, st.capture = st.census, None, False
            if census is not None:
                _write_census(t, args, census)

    return wrapper


_WRAPPERS: dict[str, Callable[[Callable, Target], Callable]] = {
    "plain": _plain,
    "round": _round,
    "step": _step,
    "capture": _capture,
    "role": override.role_wrapper,
    "override": override.override_wrapper,
}


def wrap(fn: Callable, t: Target) -> Callable:
    wrapped = _WRAPPERS[t.kind](fn, t)
    setattr(wrapped, MARK, t)
    return wrapped


# ---------------------------------------------------------------------------------------------------
# Side jobs of a capture: start the CUDA profiler (profile_from=capture) and record a census


def _maybe_start_profiler() -> None:
    """cudaProfilerStart once, in the process of the chosen device, before the first draft capture.

    Needed because nsys --capture-range=cudaProfilerApi records only between start and stop: with
    the window opened later by /start_profile, the capture-time NVTX ranges that graph-node
    attribution joins against would be missing from the report (measured on an H200, nsys 2025.3.1).
    """
    global _profiler_started
    if _profiler_started or os.environ.get(ENV_PROFILE_FROM) != "capture":
        return
    import torch  # sglang's own torch, already loaded when graphs are captured

    want = int(os.environ.get(ENV_PROFILE_DEVICE, "0"))
    if torch.cuda.current_device() != want:
        return
    torch.cuda.cudart().cudaProfilerStart()
    _profiler_started = True
    print(
        f"[kit probe] cudaProfilerStart before the first draft graph capture "
        f"(pid {os.getpid()}, cuda:{want})",
        file=sys.stderr,
        flush=True,
    )


def _write_census(t: Target, args: tuple, census: list[list[int]]) -> None:
    """One JSON line per captured shape: indexer calls per draft step of every captured draft_forward."""
    shape = args[1] if len(args) > 1 and isinstance(args[1], int) else None
    line = (
        json.dumps(
            {
                "pid": os.getpid(),
                "target": t.key,
                "shape": shape,
                "draft_forwards": census,
            }
        )
        + "\n"
    )
    fd = os.open(_census_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------------
# Patching modules, at import or when already imported


def patch_module(module: ModuleType) -> list[str]:
    """Wrap every target of `module`; idempotent. Returns the keys wrapped now."""
    global _compiling
    torch = sys.modules.get("torch")
    if (
        _compiling is _never
        and torch is not None
        and hasattr(getattr(torch, "compiler", None), "is_compiling")
    ):
        _compiling = torch.compiler.is_compiling
    done = []
    for t in _active.get(module.__name__, ()):
        cls = getattr(module, t.cls, None)
        fn = cls.__dict__.get(t.method) if isinstance(cls, type) else None
        if not callable(fn):
            raise ProbeError(
                f"kit probe: {t.key} not found after importing {module.__name__} "
                f"({module.__file__}); run `kit probe-check` on this sglang"
            )
        if getattr(fn, MARK, None) is not None:
            continue
        setattr(cls, t.method, wrap(fn, t))
        done.append(t.key)
    return done


class _PatchingLoader(importlib.abc.Loader):
    """Executes the module with its real loader, then wraps its targets. Everything else delegates."""

    def __init__(self, inner: importlib.abc.Loader):
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        patch_module(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, is_package, ...
        return getattr(self._inner, name)


class ProbeFinder(importlib.abc.MetaPathFinder):
    """First on sys.meta_path; answers only for target modules, by asking the other finders."""

    def find_spec(self, fullname: str, path: Any, target: ModuleType | None = None) -> Any:
        if fullname not in _active:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and not isinstance(spec.loader, _PatchingLoader):
                    spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


# ---------------------------------------------------------------------------------------------------
# Installation


def active_targets(
    environ: Mapping[str, str] = os.environ, targets: tuple[Target, ...] = TARGETS
) -> tuple[Target, ...]:
    """The targets this environment asks for: the ranges of the chosen set, plus the override's on a
    control run."""
    mode = environ.get(ENV_TARGET_TOPK)
    if not mode:
        return targets
    if mode not in TARGET_TOPK_MODES:
        raise ProbeRefused(f"kit probe: unknown {ENV_TARGET_TOPK}={mode!r}; use one of {TARGET_TOPK_MODES}")
    return targets + OVERRIDE_TARGETS


def check_installed_sglang(environ: Mapping[str, str] = os.environ) -> tuple[Path, str]:
    """Choose the target set for the sglang this interpreter would import and AST-check every target in it;
    ProbeRefused if the release is unknown or a target is missing. Returns (package dir, set key)."""
    from kit.probe.check import choose, probe_check, refusal, unknown_release
    from kit.sglang_src.source import PKG, module_locations

    locations = module_locations(PKG)  # located, not imported
    if not locations:
        raise ProbeRefused(
            f"kit probe: sglang is not importable by {sys.executable}; refusing to run unprobed"
        )
    pkg = Path(locations[0])
    chosen = environ.get(ENV_TARGET_SET)
    if environ.get(ENV_VERIFIED) == str(pkg) and chosen:
        return pkg, chosen
    choice = choose(pkg, scan_tree=False)
    if choice.target_set is None:
        raise ProbeRefused(unknown_release(choice, str(pkg)))
    targets = active_targets(environ, target_set(choice.target_set))
    message = refusal(probe_check(pkg, targets, scan_tree=False), str(pkg))
    if message:
        raise ProbeRefused(message)
    os.environ[ENV_VERIFIED] = str(pkg)  # inherited by spawned children: checked once per run
    os.environ[ENV_TARGET_SET] = choice.target_set
    return pkg, choice.target_set


def _configure_sink(environ: Mapping[str, str]) -> None:
    global _flush_each
    sink = environ.get(ENV_SINK, "nvtx")
    if sink == "nvtx":
        try:
            nr.configure("nvtx")
        except ImportError as e:  # missing or broken: either way the ranges would be silently absent
            raise ProbeRefused(
                f"kit probe: the `nvtx` package cannot be imported by {sys.executable} ({e}); "
                "install it into the sglang env (pip install nvtx) or the ranges would be silently absent"
            ) from None
    elif sink in ("off", "torch"):  # torch: ranges only while sglang's /start_profile profiler runs
        nr.configure(sink)
    elif sink == "recorder":
        recorder = environ.get(ENV_RECORDER)
        if not recorder:
            raise ProbeRefused(f"kit probe: {ENV_SINK}=recorder needs {ENV_RECORDER}=<sqlite path>")
        nr.configure("recorder", Path(recorder))
        # multiprocessing children leave through os._exit and clear finalizers at bootstrap, so neither
        # atexit nor multiprocessing.util.Finalize would flush there: flush per outermost range instead.
        _flush_each = True
    else:
        raise ProbeRefused(f"kit probe: unknown {ENV_SINK}={sink!r}; use nvtx, recorder, torch or off")


def install(environ: Mapping[str, str] = os.environ) -> ProbeFinder | None:
    """Check targets, configure the sink, hook imports, patch already-imported targets.

    Returns None (and does nothing at all) unless KIT_PROBE=1.
    """
    global _census_path, _active
    if environ.get(ENV_ENABLE) != "1":
        return None
    active_targets(environ)  # an unknown control mode is refused before anything is read
    _, chosen = check_installed_sglang(environ)
    _active = by_module(active_targets(environ, target_set(chosen)))
    _configure_sink(environ)
    _census_path = environ.get(ENV_CENSUS) or None
    finder = next((f for f in sys.meta_path if isinstance(f, ProbeFinder)), None)
    if finder is None:
        finder = ProbeFinder()
        sys.meta_path.insert(0, finder)
    for name in _active:
        module = sys.modules.get(name)
        if module is not None:
            patch_module(module)
    return finder


def installed() -> bool:
    return any(isinstance(f, ProbeFinder) for f in sys.meta_path)
