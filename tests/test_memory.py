"""Memory at scale: the compact batch lists draw exactly the batches of the list-of-lists
implementation they replaced (so resumes and data-parallel shards are unchanged)."""

from __future__ import annotations

import numpy as np
import pytest

from seq2seq.data.batching import BatchList, TokenBudgetBatchSampler
from seq2seq.errors import ConfigError


def reference_batches(
    src_lens: np.ndarray,
    tgt_lens: np.ndarray,
    max_tokens: int,
    shuffle: bool,
    seed: int,
    epoch: int,
    replicas: int,
    rank: int,
) -> list[list[int]]:
    """The batches as the sampler drew them before (lists of Python ints), verbatim."""
    src_size, tgt_size = src_lens + 1, tgt_lens + 1
    size = np.maximum(src_size, tgt_size)

    def cut(order: np.ndarray) -> list[list[int]]:
        batches: list[list[int]] = []
        current: list[int] = []
        longest = 0
        for i in order.tolist():
            grown = max(longest, int(size[i]))
            if current and grown * (len(current) + 1) > max_tokens:
                batches.append(current)
                current, grown = [], int(size[i])
            current.append(i)
            longest = grown
        if current:
            batches.append(current)
        return batches

    def split_until_divisible(batches: list[list[int]]) -> list[list[int]]:
        batches = list(batches)
        while len(batches) % replicas:
            biggest = max(range(len(batches)), key=lambda i: len(batches[i]))
            batch = batches[biggest]
            if len(batch) < 2:
                raise ConfigError("too few pairs")
            half = len(batch) // 2
            batches[biggest : biggest + 1] = [batch[:half], batch[half:]]
        return batches

    if not shuffle:
        order = np.lexsort((tgt_size, src_size))
        return split_until_divisible(cut(order))[rank::replicas]
    rng = np.random.default_rng([seed, epoch])
    perm = rng.permutation(len(size))
    order = perm[np.lexsort((tgt_size[perm], src_size[perm]))]
    batches = split_until_divisible(cut(order))
    return [batches[i] for i in rng.permutation(len(batches))][rank::replicas]


def reference_padding(src_lens: np.ndarray, tgt_lens: np.ndarray, batches: list[list[int]]):
    real = padded = 0
    for batch in batches:
        real += int(src_lens[batch].sum() + tgt_lens[batch].sum()) + 2 * len(batch)
        padded += len(batch) * int(src_lens[batch].max() + tgt_lens[batch].max() + 2)
    return 1.0 - real / padded if padded else 0.0


def lengths(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    src = rng.integers(1, 60, size=n)
    tgt = np.maximum(1, src + rng.integers(-8, 9, size=n))
    src[rng.integers(0, n, size=3)] = 300  # longer than the budget: batches of their own
    return src, tgt


@pytest.mark.parametrize("replicas", [1, 2, 3])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("max_tokens", [256, 1000, 4096])
def test_the_same_batches_in_the_same_order_as_lists_of_ints(
    replicas: int, shuffle: bool, max_tokens: int
) -> None:
    src, tgt = lengths(max_tokens + replicas, 3001)
    for rank in range(replicas):
        sampler = TokenBudgetBatchSampler(src, tgt, max_tokens, shuffle, 7, replicas, rank)
        for epoch in (0, 1, 4):
            sampler.set_epoch(epoch)
            expected = reference_batches(src, tgt, max_tokens, shuffle, 7, epoch, replicas, rank)
            assert list(sampler) == expected
            assert len(sampler) == len(expected)
            assert list(sampler.batches()) == expected
            assert sampler.padding_fraction() == pytest.approx(
                reference_padding(src, tgt, expected), abs=1e-12
            )


def test_a_resumed_pass_serves_the_remaining_batches_of_the_reference() -> None:
    src, tgt = lengths(1, 2000)
    expected = reference_batches(src, tgt, 800, True, 3, 2, 2, 1)
    sampler = TokenBudgetBatchSampler(src, tgt, 800, True, 3, 2, 1)
    sampler.set_epoch(2)
    sampler.resume(2, 5)
    assert list(sampler) == expected[5:]
    assert list(sampler) == expected  # the offset applies to one pass only


def test_the_same_error_when_the_processes_cannot_share_the_batches() -> None:
    sizes = np.array([5, 5, 5])
    sampler = TokenBudgetBatchSampler(sizes, sizes, 6, True, 0, 2, 0)
    with pytest.raises(ConfigError, match="trainer.devices: 3 batches of one pair each"):
        len(sampler)
    with pytest.raises(ConfigError):
        reference_batches(sizes, sizes, 6, True, 0, 0, 2, 0)


def test_an_empty_split_has_no_batches() -> None:
    empty = np.zeros(0, dtype=np.int64)
    sampler = TokenBudgetBatchSampler(empty, empty, 100, True, 0, 2, 1)
    assert list(sampler) == [] and len(sampler) == 0
    assert sampler.padding_fraction() == 0.0


def test_batch_list_indexes_and_slices_like_a_list() -> None:
    order = np.array([5, 3, 9, 0, 1, 7, 2])
    offsets = np.array([0, 2, 3, 6, 7])
    as_lists = [[5, 3], [9], [0, 1, 7], [2]]
    batches = BatchList.gather(order, offsets, np.arange(4))
    assert batches.indices.dtype == np.int32
    assert list(batches) == as_lists and len(batches) == 4
    assert [batches[k] for k in range(-4, 4)] == as_lists[-4:] + as_lists
    for part in (slice(None, 2), slice(1, None), slice(None, None, 2), slice(3, 0, -1)):
        assert list(batches[part]) == as_lists[part]
    assert list(BatchList.gather(order, offsets, np.array([2, 0]))) == [[0, 1, 7], [5, 3]]
    with pytest.raises(IndexError):
        batches[4]
