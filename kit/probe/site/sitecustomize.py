"""kit probe bootstrap: on PYTHONPATH first, runs at every interpreter start-up (sglang's spawned
scheduler processes included). Does nothing unless KIT_PROBE=1; then installs kit.probe or, when
the installed sglang lacks a probe target, exits the process with code 3 and a message naming them.
Whatever sitecustomize this one shadows (e.g. the distribution's) still runs afterwards.
"""

import os
import sys


def _kit_probe_boot() -> None:
    root = os.environ.get("KIT_PROBE_ROOT")
    if root and "kit" not in sys.modules:
        import importlib.util

        init = os.path.join(root, "kit", "__init__.py")
        spec = importlib.util.spec_from_file_location(
            "kit", init, submodule_search_locations=[os.path.dirname(init)]
        )
        if spec is None or spec.loader is None:
            sys.stderr.write(
                f"kit probe: KIT_PROBE_ROOT={root} holds no kit package; refusing to run unprobed\n"
            )
            sys.stderr.flush()
            os._exit(3)
        module = importlib.util.module_from_spec(spec)
        sys.modules["kit"] = module
        spec.loader.exec_module(module)
    try:
        from kit.probe.install import ProbeRefused, install
    except ImportError as e:
        sys.stderr.write(f"kit probe: cannot import kit.probe ({e}); set KIT_PROBE_ROOT or install the kit\n")
        sys.stderr.flush()
        os._exit(3)
    try:
        install()
    except ProbeRefused as e:  # a SystemExit here would be a fatal init error; leave cleanly instead
        sys.stderr.write(f"{e}\n")
        sys.stderr.flush()
        os._exit(3)
    except Exception as e:  # anything else would leave the process running unprobed: "0 launches"
        sys.stderr.write(f"kit probe: installing the probes failed ({e!r}); refusing to run unprobed\n")
        sys.stderr.flush()
        os._exit(3)


def _chain_next_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # same leniency as site.py gives a sitecustomize
        sys.stderr.write(f"Error in sitecustomize (chained by kit probe, {spec.origin}): {e!r}\n")


if os.environ.get("KIT_PROBE") == "1":
    _kit_probe_boot()
_chain_next_sitecustomize()
