"""Host time of one step's metadata building for every attention group of a pair.

Per forward pass the engine builds every KV-cache group's
``CommonAttentionMetadata`` in one ``StepMetadataBuilder`` build and hands each
group's object to its attention groups' builders (``builder.build``). This
times exactly that path, ``attngroup.reference_engine.engine.forward_metadata.ForwardMetadataBuilder.build``,
for a verify step (q_len k+1 per request) at a given batch size, as the median
over timed steps after warm-up. The block tables (int32 host arrays, one per
KV-cache group) are the step's input, made once, as the runner makes them
from the scheduler's block ids before it builds.

    python -m attngroup.benchmarks.bench_metadata --pair gemma4-e2b-mtp --batch 64 --json out/bench/metadata.json

``--record PATH`` writes the run record that ``python -m attngroup.reports compare`` reads
(``attngroup.benchmarks.run_record``).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from attngroup.benchmarks.cli import argument_parser
from attngroup.reference_engine.model_pairs import MODEL_PAIRS

if TYPE_CHECKING:  # torch and the engine load after the arguments are parsed
    import torch

BLOCK_SIZE = 16


def build_step_timer(
    pair_name: str, batch: int, context_len: int, query_len: int, device: torch.device
):
    """A function that builds one step's metadata for every group, and the builder count."""
    import torch

    from attngroup.kernels.metadata import cdiv
    from attngroup.reference_engine.engine.forward_metadata import ForwardMetadataBuilder

    metadata = ForwardMetadataBuilder.for_pair(
        pair_name,
        device,
        dtype=torch.bfloat16,
        block_size=BLOCK_SIZE,
        max_num_seqs=batch,
        max_query_len=query_len,
        max_num_tokens=batch * query_len,
        max_blocks_per_seq=cdiv(context_len, BLOCK_SIZE),
    )
    block_tables = {}
    for group_id, block_size in enumerate(metadata.block_sizes):
        blocks = cdiv(context_len, block_size)
        table = torch.randperm(batch * blocks).reshape(batch, blocks).to(torch.int32) + 1
        block_tables[group_id] = table.numpy()
    seq_lens = (context_len,) * batch
    query_lens = (query_len,) * batch

    def step() -> None:
        metadata.build(seq_lens, query_lens, block_tables)

    return step, sum(len(row) for row in metadata.attention_groups)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser("attngroup.benchmarks.bench_metadata", __doc__)
    parser.add_argument("--pair", choices=sorted(MODEL_PAIRS), default="gemma4-e2b-mtp")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context-len", type=int, default=8192)
    parser.add_argument("--query-len", type=int, default=4, help="k+1 (verify)")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--json", type=Path, help="write the metric list to this JSON file")
    parser.add_argument("--record", type=Path, help="write a run record to this JSON file")
    args = parser.parse_args(argv)
    if args.runs < 2 or args.batch < 1:
        print("error: --runs must be >= 2 and --batch >= 1", file=sys.stderr)
        return 2
    import torch

    from attngroup.benchmarks.run_record import RecordWriter
    from attngroup.reports.atomic import write_text_atomic

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    record = None
    if args.record is not None:
        record = RecordWriter(args.record, "attngroup/benchmarks/bench_metadata.py", device)
    step, num_builders = build_step_timer(
        args.pair, args.batch, args.context_len, args.query_len, device
    )
    for _ in range(5):
        step()
    samples = []
    for _ in range(args.runs):
        start = time.perf_counter()
        step()
        samples.append((time.perf_counter() - start) * 1e6)
    median = statistics.median(samples)
    deciles = statistics.quantiles(samples, n=10)
    print(
        f"metadata.{args.pair}.b{args.batch}: {num_builders} builders, median {median:.1f} us host time "
        f"per step (p10 {deciles[0]:.1f}, p90 {deciles[-1]:.1f}) on {device}"
    )
    metric = {
        "name": f"metadata.{args.pair}.b{args.batch}.host_us",
        "value": median,
        "unit": "us",
        "samples": samples,
        "higher_is_better": False,
    }
    if args.json:
        write_text_atomic(args.json, json.dumps([metric], indent=1))
    if record is not None:
        record.write([metric])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
