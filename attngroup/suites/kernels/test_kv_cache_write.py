"""The KV-cache write kernel against an index_copy reference, bit for bit.

The caches start filled with a poison bit pattern; after the write, the slots of real
tokens hold their keys and values and every other slot (padding tokens' -1, unused slots)
keeps the poison bits.
"""

from __future__ import annotations

import pytest
import torch

from attngroup.kernels.cache_layout import PADDING_SLOT
from attngroup.kernels.ops import COMPILER_OPTIONS, kv_cache_write
from attngroup.kernels.ops.kv_cache_write import write_kv_cache
from attngroup.suites.kernels.batches import BATCHES_CPU, gpu_only, make_paged_batch

pytestmark = pytest.mark.kernels

POISON_BYTE = 0x6B
INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def _poisoned_cache(
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_size: int,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    cache = torch.empty(num_blocks, block_size, num_kv_heads, head_size, dtype=dtype, device=device)
    cache.view(torch.uint8).fill_(POISON_BYTE)
    return cache


def _slot_mapping(num_tokens: int, num_slots: int, num_padding: int, seed: int) -> torch.Tensor:
    """Distinct random slots for real tokens, with ``num_padding`` -1 entries interleaved."""
    generator = torch.Generator().manual_seed(seed)
    slots = torch.randperm(num_slots, generator=generator)[: num_tokens - num_padding]
    padding = torch.full((num_padding,), PADDING_SLOT)
    order = torch.randperm(num_tokens, generator=generator)
    return torch.cat([slots, padding])[order]


def _reference_write(cache: torch.Tensor, rows: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """index_copy of the non-padding rows into the cache's [slots, heads, dim] view."""
    real = slot_mapping != PADDING_SLOT
    flat = cache.view(-1, *cache.shape[2:])
    flat.index_copy_(0, slot_mapping[real], rows[: slot_mapping.shape[0]][real])


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(INT_VIEW[tensor.dtype])


WRITE_CASES = [
    # (num_kv_heads, head_size, block_size, dtype, num_tokens, num_padding, on_gpu)
    (1, 256, 16, torch.float32, 12, 3, False),
    (1, 512, 64, torch.float16, 9, 1, False),
    (2, 256, 32, torch.bfloat16, 7, 2, False),
    (8, 64, 16, torch.float16, 20, 5, False),
    (4, 96, 16, torch.float32, 5, 0, False),
    (8, 128, 16, torch.bfloat16, 4000, 123, True),
    (1, 512, 64, torch.bfloat16, 999, 17, True),
]


def _case_id(case: tuple) -> str:
    heads, head_size, block_size, dtype, tokens, padding, on_gpu = case
    name = str(dtype).removeprefix("torch.").replace("float", "fp").replace("bfp", "bf")
    prefix = "gpu-" if on_gpu else ""
    return f"{prefix}hkv{heads}-d{head_size}-bs{block_size}-{name}-tok{tokens}-pad{padding}"


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(case, id=_case_id(case), marks=[pytest.mark.gpu, gpu_only] if case[-1] else [])
        for case in WRITE_CASES
    ],
)
@pytest.mark.parametrize("extra_rows", [0, 3], ids=["exact", "padded-key-rows"])
def test_write_matches_index_copy(case: tuple, extra_rows: int, device: torch.device) -> None:
    num_kv_heads, head_size, block_size, dtype, num_tokens, num_padding, on_gpu = case
    device = torch.device("cuda") if on_gpu else device
    num_blocks = num_tokens // block_size + 3
    slot_mapping = _slot_mapping(num_tokens, num_blocks * block_size, num_padding, seed=num_tokens)
    key = torch.randn(num_tokens + extra_rows, num_kv_heads, head_size).to(dtype)
    value = torch.randn(num_tokens + extra_rows, num_kv_heads, head_size).to(dtype)
    key_cache = _poisoned_cache(num_blocks, block_size, num_kv_heads, head_size, dtype, device)
    value_cache = _poisoned_cache(num_blocks, block_size, num_kv_heads, head_size, dtype, device)
    expected_keys = key_cache.to("cpu", copy=True)
    expected_values = value_cache.to("cpu", copy=True)
    _reference_write(expected_keys, key, slot_mapping)
    _reference_write(expected_values, value, slot_mapping)

    write_kv_cache(
        key.to(device), value.to(device), key_cache, value_cache, slot_mapping.to(device)
    )

    assert torch.equal(_bits(key_cache.cpu()), _bits(expected_keys))
    assert torch.equal(_bits(value_cache.cpu()), _bits(expected_values))
    untouched = torch.ones(num_blocks * block_size, dtype=torch.bool)
    untouched[slot_mapping[slot_mapping != PADDING_SLOT]] = False
    assert int(untouched.sum()) == num_blocks * block_size - (num_tokens - num_padding)
    for cache in (key_cache, value_cache):
        slot_bytes = cache.cpu().view(num_blocks * block_size, -1).view(torch.uint8)
        assert (slot_bytes[untouched] == POISON_BYTE).all()


def test_write_into_views_of_one_kv_tensor(device: torch.device) -> None:
    """K and V as the two halves of one [num_blocks, 2, block_size, heads, dim] tensor, as
    vLLM allocates them; the writes land in the right half and nowhere else."""
    kv = torch.empty(6, 2, 16, 2, 64, device=device)
    kv.view(torch.uint8).fill_(POISON_BYTE)
    key_cache, value_cache = kv.unbind(1)
    slot_mapping = torch.tensor([5, PADDING_SLOT, 90, 17, 33], dtype=torch.int32, device=device)
    key, value = torch.randn(5, 2, 64, device=device), torch.randn(5, 2, 64, device=device)
    expected_keys, expected_values = key_cache.contiguous(), value_cache.contiguous()
    _reference_write(expected_keys, key, slot_mapping.long())
    _reference_write(expected_values, value, slot_mapping.long())

    write_kv_cache(key, value, key_cache, value_cache, slot_mapping)

    assert torch.equal(_bits(kv[:, 0]), _bits(expected_keys))
    assert torch.equal(_bits(kv[:, 1]), _bits(expected_values))


def test_out_of_range_slot_is_refused_and_never_written(device: torch.device) -> None:
    storage = torch.empty(5 * 16 * 64, device=device)
    storage.view(torch.uint8).fill_(POISON_BYTE)
    key_cache = storage[: 4 * 16 * 64].view(4, 16, 1, 64)  # the last block is a guard region
    value_cache = torch.zeros(4, 16, 1, 64, device=device)
    slot_mapping = torch.tensor([3, 64, 70], device=device)
    key, value = torch.randn(3, 1, 64, device=device), torch.randn(3, 1, 64, device=device)

    with pytest.raises(ValueError, match=r"outside \[0, 64\).*\[64, 70\]"):
        write_kv_cache(key, value, key_cache, value_cache, slot_mapping, validate=True)
    write_kv_cache(key, value, key_cache, value_cache, slot_mapping)

    guard = storage[4 * 16 * 64 :]
    assert torch.equal(
        guard.view(torch.uint8), torch.full_like(guard.view(torch.uint8), POISON_BYTE)
    )
    assert torch.equal(key_cache[0, 3, 0], key[0, 0])


@pytest.mark.parametrize("kind", ["chunked", "verify"])
def test_write_places_new_tokens_where_attention_reads_them(
    kind: str, device: torch.device
) -> None:
    """Writing a step's new tokens through its slot mapping into a cache whose new-token
    slots were poisoned restores exactly the cache the step's block table describes."""
    batch = make_paged_batch(
        BATCHES_CPU[kind],
        num_heads_q=4,
        num_kv_heads=2,
        head_size=64,
        block_size=16,
        dtype=torch.float16,
        seed=3,
        device=device,
    )
    spec = batch.spec
    new_rows = [
        slice(seq_len - query_len, seq_len)
        for seq_len, query_len in zip(spec.seq_lens, spec.query_lens, strict=True)
    ]
    key = torch.cat([keys[rows] for keys, rows in zip(batch.keys, new_rows, strict=True)])
    value = torch.cat([values[rows] for values, rows in zip(batch.values, new_rows, strict=True)])
    key_cache, value_cache = batch.key_cache.clone(), batch.value_cache.clone()
    poison = torch.empty_like(key)
    poison.view(torch.uint8).fill_(POISON_BYTE)
    for cache in (key_cache, value_cache):
        cache.view(-1, *cache.shape[2:])[batch.slot_mapping] = poison
    assert not torch.equal(_bits(key_cache), _bits(batch.key_cache))

    write_kv_cache(key, value, key_cache, value_cache, batch.slot_mapping)

    assert torch.equal(_bits(key_cache), _bits(batch.key_cache))
    assert torch.equal(_bits(value_cache), _bits(batch.value_cache))


def test_the_launch_states_the_compiler_options(monkeypatch: pytest.MonkeyPatch) -> None:
    launched: list[dict[str, object]] = []

    class RecordingKernel:
        def __getitem__(self, grid: tuple[int, ...]):
            return lambda *arguments, **keywords: launched.append(keywords)

    monkeypatch.setattr(kv_cache_write, "_write_kv_cache_kernel", RecordingKernel())
    key, value = torch.randn(2, 1, 64), torch.randn(2, 1, 64)
    caches = torch.zeros(4, 16, 1, 64), torch.zeros(4, 16, 1, 64)
    write_kv_cache(key, value, *caches, torch.tensor([0, 1]))
    (keywords,) = launched
    assert COMPILER_OPTIONS.items() <= keywords.items()


SHAPE_ERRORS = {
    "head-size": (dict(key=torch.randn(2, 1, 32)), "key must be"),
    "dtype": (dict(value=torch.randn(2, 1, 64).half()), "value dtype"),
    "slot-dtype": (dict(slot_mapping=torch.tensor([0.0, 1.0])), "slot_mapping must be a 1-D int"),
    "more-slots-than-rows": (dict(slot_mapping=torch.tensor([0, 1, 2])), "slot_mapping has 3"),
    "cache-shapes": (dict(value_cache=torch.zeros(4, 16, 2, 64)), "key_cache and value_cache"),
}


@pytest.mark.parametrize(("overrides", "message"), SHAPE_ERRORS.values(), ids=SHAPE_ERRORS)
def test_bad_shapes_raise(overrides: dict, message: str) -> None:
    arguments = {
        "key": torch.randn(2, 1, 64),
        "value": torch.randn(2, 1, 64),
        "key_cache": torch.zeros(4, 16, 1, 64),
        "value_cache": torch.zeros(4, 16, 1, 64),
        "slot_mapping": torch.tensor([0, 1]),
    } | overrides
    with pytest.raises(ValueError, match=message):
        write_kv_cache(**arguments)
