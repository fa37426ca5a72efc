"""KV-cache specs: value equality, the draft flag, page sizes and merge rules."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from attngroup.reference_engine.kv_cache_spec import (
    FullAttentionSpec,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
    SpecMergeError,
    UniformTypeKVCacheSpecs,
)

pytestmark = pytest.mark.grouping


def full(**overrides) -> FullAttentionSpec:
    fields: dict[str, Any] = dict(
        block_size=16, num_kv_heads=1, head_size=256, dtype=torch.bfloat16
    )
    return FullAttentionSpec(**(fields | overrides))


def sliding(**overrides) -> SlidingWindowSpec:
    fields: dict[str, Any] = dict(
        block_size=16, num_kv_heads=1, head_size=256, dtype=torch.bfloat16, sliding_window=512
    )
    return SlidingWindowSpec(**(fields | overrides))


def mamba(**overrides) -> MambaSpec:
    fields: dict[str, Any] = dict(
        block_size=16, shapes=((8, 3), (4, 16, 16)), dtypes=(torch.float32,) * 2
    )
    return MambaSpec(**(fields | overrides))


SPEC_MAKERS = {"full": full, "sliding": sliding, "mamba": mamba}


@pytest.mark.parametrize("kind", SPEC_MAKERS)
def test_equal_fields_mean_equal_specs_and_hashes(kind):
    make = SPEC_MAKERS[kind]
    assert make() == make()
    assert hash(make()) == hash(make())
    assert len({make(), make()}) == 1


@pytest.mark.parametrize("kind", SPEC_MAKERS)
def test_draft_flag_never_affects_equality_or_hash(kind):
    make = SPEC_MAKERS[kind]
    target, draft = make(), make(is_draft=True)
    assert draft.is_draft and not target.is_draft
    assert target == draft
    assert hash(target) == hash(draft)


@pytest.mark.parametrize(
    ("spec", "other"),
    [
        pytest.param(full(), full(block_size=32), id="block_size"),
        pytest.param(full(), full(num_kv_heads=2), id="num_kv_heads"),
        pytest.param(full(), full(head_size=512), id="head_size"),
        pytest.param(full(), full(dtype=torch.float16), id="dtype"),
        pytest.param(full(), full(sliding_window=512), id="window"),
        pytest.param(sliding(), sliding(sliding_window=1024), id="sliding_window"),
        pytest.param(full(), sliding(), id="type"),
    ],
)
def test_any_real_field_difference_breaks_equality(spec, other):
    assert spec != other


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param(full(), 2 * 16 * 1 * 256 * 2, id="full-bf16"),
        pytest.param(
            full(num_kv_heads=2, head_size=512, dtype=torch.float32),
            2 * 16 * 2 * 512 * 4,
            id="full-fp32",
        ),
        pytest.param(sliding(block_size=32), 2 * 32 * 1 * 256 * 2, id="sliding-bs32"),
        pytest.param(SPEC_MAKERS["mamba"](), (8 * 3 + 4 * 16 * 16) * 4, id="mamba-state"),
        pytest.param(SPEC_MAKERS["mamba"](page_size_padded=8192), 8192, id="mamba-padded"),
    ],
)
def test_page_size_bytes(spec, expected):
    assert spec.page_size_bytes == expected


def test_equal_specs_merge():
    assert FullAttentionSpec.merge([full(), full(is_draft=True)]) == full()


def test_full_attention_with_and_without_window_merge_keeping_the_window():
    merged = FullAttentionSpec.merge([full(), full(sliding_window=512)])
    assert merged == full(sliding_window=512)


def test_two_different_windows_do_not_merge():
    with pytest.raises(SpecMergeError, match=r"different sliding windows \[512, 1024\]"):
        FullAttentionSpec.merge([full(sliding_window=512), full(sliding_window=1024)])


def test_different_specs_do_not_merge():
    with pytest.raises(SpecMergeError, match="cannot share a KV-cache group"):
        SlidingWindowSpec.merge([sliding(), sliding(head_size=512)])


def test_uniform_type_specs_sum_pages_and_look_up_layers():
    small, large = full(head_size=64), full(head_size=128)
    uniform = UniformTypeKVCacheSpecs.from_specs({"a": small, "b": large})
    assert uniform is not None
    assert uniform.page_size_bytes == small.page_size_bytes + large.page_size_bytes
    assert uniform.spec_for("b") == large
    assert hash(uniform) == hash(UniformTypeKVCacheSpecs.from_specs({"a": small, "b": large}))
    group = KVCacheGroupSpec(["a", "b"], uniform)
    assert group.spec_for("a") == small
    with pytest.raises(KeyError, match="'c' is not in this UniformTypeKVCacheSpecs"):
        group.spec_for("c")


@pytest.mark.parametrize(
    "specs",
    [
        pytest.param({"a": full(), "b": sliding()}, id="different-types"),
        pytest.param({"a": full(), "b": full(block_size=32)}, id="different-block-sizes"),
        pytest.param(
            {"a": sliding(), "b": sliding(sliding_window=64)}, id="different-sliding-windows"
        ),
    ],
)
def test_uniform_type_specs_refuse_layers_that_need_other_slots(specs):
    assert UniformTypeKVCacheSpecs.from_specs(specs) is None


@pytest.mark.parametrize(
    ("make", "match"),
    [
        pytest.param(lambda: full(block_size=0), "block_size must be positive", id="block-size"),
        pytest.param(lambda: full(num_kv_heads=0), "must be positive", id="kv-heads"),
        pytest.param(
            lambda: sliding(sliding_window=0), "sliding_window must be positive", id="window"
        ),
        pytest.param(
            lambda: MambaSpec(block_size=16, shapes=((4,),), dtypes=()),
            "1 shapes but 0 dtypes",
            id="mamba-dtypes",
        ),
        pytest.param(
            lambda: SPEC_MAKERS["mamba"](page_size_padded=8),
            "below the state size",
            id="mamba-padding",
        ),
    ],
)
def test_invalid_specs_are_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make()
