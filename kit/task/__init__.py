"""Task checkpoints: a DSA + NextN checkpoint whose answers depend on what the lightning indexer selects
(kit.task.weights, written by kit.task.make), prompts with known answers (kit.task.workload), and a float32
reference that generates them with EAGLE speculative decoding, the draft's top-k recomputed or shared
(kit.task.reference)."""

from kit.task.make import make_task_checkpoint
from kit.task.spec import TASK_FORMAT, TaskSpec, read_task
from kit.task.workload import WORKLOADS, TaskPrompt, accuracy, score_row, task_prompt

__all__ = [
    "TASK_FORMAT",
    "WORKLOADS",
    "TaskPrompt",
    "TaskSpec",
    "accuracy",
    "make_task_checkpoint",
    "read_task",
    "score_row",
    "task_prompt",
]
