"""Generated checkpoints that real sglang serves (no DSA weights can be downloaded on the GPU hosts).

`layout`: the shared architecture (config, sglang's constraints, tensor names/shapes); `files`: writing
(safetensors, tokenizer, the directory published whole); `cycle`: the next-token-cycle checkpoint of
`kit make-checkpoint`. The retrieval-task checkpoint is `kit.task.weights`. The names below are the facade.
"""

from kit.checkpoint.cycle import REFERENCE_SHA256, make_checkpoint, next_token_cycle
from kit.checkpoint.files import FORMAT, MANIFEST, WEIGHTS, summary
from kit.checkpoint.layout import GAINS, TensorSpec, model_config, sglang_constraints, tensor_specs

__all__ = [
    "FORMAT",
    "GAINS",
    "MANIFEST",
    "REFERENCE_SHA256",
    "WEIGHTS",
    "TensorSpec",
    "make_checkpoint",
    "model_config",
    "next_token_cycle",
    "sglang_constraints",
    "summary",
    "tensor_specs",
]
