"""One tensor-parallel rank of a speculative-decoding run (launched by test_tensor_parallel).

``python -m suites.spec_decode.tp_worker --pair P --rank R --world-size N --port PORT --out FILE``
joins a gloo process group on 127.0.0.1, runs greedy speculative decoding on
its shard on the CPU (the launcher sets TRITON_INTERPRET=1 for the KV write), and writes its tokens and its attention groups' per-rank head
counts to ``FILE`` (atomically: temp file + rename).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch.distributed as dist

from suites.spec_decode.harness import DTYPES, EngineFactory, greedy_generate, prompts_for


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pair", required=True)
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    parser.add_argument("--num-spec-tokens", type=int, default=1)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--weights-root", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{args.port}",
        rank=args.rank,
        world_size=args.world_size,
    )
    try:
        engine = EngineFactory(args.weights_root).engine(
            args.pair,
            backend=args.backend,
            dtype=DTYPES[args.dtype],
            device="cpu",
            num_spec_tokens=args.num_spec_tokens,
            tp_rank=args.rank,
            tp_size=args.world_size,
            tp_group=dist.group.WORLD,
        )
        tokens = greedy_generate(engine, prompts_for(args.pair))
        heads = [[group.num_heads_q for group in row] for row in engine.runner.attention_groups]
    finally:
        dist.destroy_process_group()
    temporary = args.out.with_suffix(".tmp")
    temporary.write_text(json.dumps({"tokens": tokens, "heads": heads}))
    os.replace(temporary, args.out)


if __name__ == "__main__":
    main()
