"""What may pass through to sglang's server as extra args: the flags the kit sets itself (passing them would
silently change the experiment), the flags that move the draft loop off the probed path, and the capacity
flags that must leave room for the kit's requests."""

from __future__ import annotations

from kit.errors import UsageError

# Flags the kit sets itself: passing them through extra_args would silently change the experiment.
_OWNED = {
    "--model-path",
    "--model",
    "--tp-size",
    "--tp",
    "--tensor-parallel-size",
    "--speculative-algorithm",
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
    "--json-model-override-args",
    "--disable-cuda-graph",
    "--cuda-graph-backend-decode",
    "--host",
    "--port",
    "--nccl-port",
    "--nnodes",
    "--node-rank",
    "--dist-init-addr",
    "--nccl-init-addr",
    "--trust-remote-code",
}
# Flags that move the draft loop off the path the probe instruments.
_REFUSED = {
    "--enable-multi-layer-eagle": "runs MultiLayerEagleWorkerV2, a draft loop the probe does not instrument",
    "--speculative-draft-model-path": "the MTP draft must be the model's own NextN layer",
    "--speculative-draft-model": "the MTP draft must be the model's own NextN layer",
    "--enable-dp-attention": "not part of the PR's setup; its draft path is not verified by the kit",
}


# Server flags whose values must leave room for the kit's requests: (flag, what it bounds).
_CAPACITY = ("--cuda-graph-max-bs", "--cuda-graph-bs", "--max-running-requests", "--context-length")


def _flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


def _flag_values(extra: list[str], flag: str) -> list[str] | None:
    """The values an argument list gives `flag` (`--f=v` or `--f v [v ...]`); None where it is absent."""
    for i, a in enumerate(extra):
        if a.startswith(flag + "="):
            return [a.split("=", 1)[1]]
        if a == flag:
            vals = []
            for b in extra[i + 1 :]:
                if b.startswith("--"):
                    break
                vals.append(b)
            return vals
    return None


def _check_capacity(extra: list[str], concurrency: int, cuda_graph: bool, longest: int) -> None:
    """Refuse extra args that leave no room for the kit's requests: fewer graph batch sizes or running
    requests than the concurrency (the rounds would run outside the captured graphs, or queue), or a
    server context length below the longest cell."""
    need = {
        "--cuda-graph-max-bs": concurrency if cuda_graph else 0,
        "--cuda-graph-bs": concurrency if cuda_graph else 0,
        "--max-running-requests": concurrency,
        "--context-length": longest,
    }
    for flag in _CAPACITY:
        vals = _flag_values(extra, flag)
        if vals is None:
            continue
        try:
            top = max(int(v) for v in vals)
        except ValueError:
            raise UsageError(
                f"extra arg {flag} {vals}: expected integer value(s)", param="extra_args"
            ) from None
        if top < need[flag]:
            what = "context_len + max_new_tokens" if flag == "--context-length" else "concurrency"
            raise UsageError(
                f"extra arg {flag} {top} is below {what} = {need[flag]}: raise it or lower {what}",
                param="extra_args",
            )


def checked_extra_args(extra: object, concurrency: int, cuda_graph: bool, longest: int) -> list[str]:
    """`extra` as an argument list, refused where it names a flag the kit owns or refuses, or leaves no room
    for the kit's requests (`longest`: the longest cell's context_len + max_new_tokens)."""
    if not isinstance(extra, (list, tuple)) or not all(isinstance(a, str) for a in extra):
        raise UsageError(
            "extra_args must be a list of strings (an argument list, never a shell string)",
            param="extra_args",
        )
    for a in extra:
        name = _flag_name(a)
        if name in _OWNED:
            raise UsageError(
                f"extra arg {name} is set by the kit; use the kit's own parameter instead", param="extra_args"
            )
        if name in _REFUSED:
            raise UsageError(f"extra arg {name} refused: {_REFUSED[name]}", param="extra_args")
    _check_capacity(list(extra), concurrency, cuda_graph, longest)
    return list(extra)
