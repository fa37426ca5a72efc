"""Whether one attention group's kernels can run inside a CUDA graph, decided from its own layers.

A captured step replays the kernel launches of its capture: every host-side value a
backend reads at launch (grid sizes, plan data, Python ints of the batch) is frozen then.
So each attention group's builder answers for its own head count, head size, window and
query length, never for the model's or the target's (vLLM #56289 computed FlashInfer's
answer from the target's head count and turned graphs off for every group), and the engine
runs eagerly only the steps that touch a group that cannot be captured.

The rules, one per backend:

- ``torch`` (the oracle): never. It loops over requests on the host reading the lengths'
  host copies, so a replay would attend with the captured batch's lengths.
- ``triton``: yes. The launch plan is fixed per bucket (``max_seq_len`` is the captured
  context capacity, so grid and split-KV segments never change; each program reads its own
  sequence's length on the device), and the split-KV scratch must hold the bucket's tokens
  at the group's head count.
- ``flashinfer``: yes where a wrapper choice exists for the head size and query length
  (``flashinfer_attn.choose_wrapper``); the CUDA-graph wrappers (``flashinfer_graph``) take
  index buffers sized for the bucket and are planned outside the graph before each replay.
- State (Mamba-like) groups: never; their layers walk the requests on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

from attngroup.kernels.backends.flashinfer_attn import choose_wrapper, query_shape_of_length
from attngroup.kernels.ops.triton_launch_config import MAX_3D_QUERY_LEN, MIN_LAUNCH_GRID_SIZE_2D

STATE_GROUP = "state"
"""Backend name the capture plan gives a state (Mamba-like) group."""


@dataclass(frozen=True)
class GroupGeometry:
    """What a group's capture decision depends on: its own layers, per tensor-parallel rank."""

    backend: str
    num_heads_q: int
    num_kv_heads: int
    head_size: int
    sliding_window: int | None


@dataclass(frozen=True)
class GraphSupport:
    """One group's answer for one step shape: capturable, or why not."""

    capturable: bool
    reason: str


def graph_support(
    group: GroupGeometry, *, query_len: int, num_reqs: int, scratch_rows: int | None = None
) -> GraphSupport:
    """Can ``group`` run a step of ``num_reqs`` requests of ``query_len`` tokens inside a graph?

    ``scratch_rows`` is the rows of the group's Triton split-KV scratch (None: sized as the
    Triton builder sizes it for ``num_reqs`` requests of ``query_len``).
    """
    if group.backend == STATE_GROUP:
        return GraphSupport(False, "a state group's layers loop over the requests on the host")
    if group.backend == "torch":
        return GraphSupport(
            False,
            "the torch reference loops over requests on the host copies of the lengths; a "
            "replay would attend with the captured batch's lengths",
        )
    if group.backend == "triton":
        return _triton_support(group, query_len, num_reqs, scratch_rows)
    if group.backend == "flashinfer":
        return _flashinfer_support(group, query_len)
    return GraphSupport(False, f"no CUDA-graph rule for backend {group.backend!r}")


def _triton_support(
    group: GroupGeometry, query_len: int, num_reqs: int, scratch_rows: int | None
) -> GraphSupport:
    """The split-KV path runs for up to ``128 // num_kv_heads`` requests of at most 8 query
    tokens; its scratch must then hold every token of the bucket."""
    seq_threshold_3d = max(1, MIN_LAUNCH_GRID_SIZE_2D // group.num_kv_heads)
    if num_reqs > seq_threshold_3d or query_len > MAX_3D_QUERY_LEN:
        return GraphSupport(True, "Triton 2D launch fixed per bucket")
    rows = scratch_rows if scratch_rows is not None else num_reqs * query_len
    if rows < num_reqs * query_len:
        return GraphSupport(
            False,
            f"the split-KV scratch holds {rows} rows of {group.num_heads_q} heads, the bucket "
            f"needs {num_reqs * query_len}",
        )
    return GraphSupport(True, "Triton split-KV launch fixed per bucket")


def _flashinfer_support(group: GroupGeometry, query_len: int) -> GraphSupport:
    try:
        choice = choose_wrapper(group.head_size, query_shape_of_length(query_len))
    except ValueError as error:
        return GraphSupport(False, str(error))
    return GraphSupport(
        True,
        f"FlashInfer CUDA-graph {choice.describe()} wrapper planned for {group.num_heads_q} "
        "query heads before each replay",
    )
