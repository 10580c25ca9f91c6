"""`ddp_teach.sampler`: index for index against torch's DistributedSampler
(shuffle on/off, drop_last on/off, world sizes 1-5, lengths 0-23 so both
divisible and not, and shorter than the world; several epochs), the
coverage and no-duplicate promises, the errors, and the defaults taken from
a real process group."""
import itertools

import pytest
from torch.utils.data.distributed import DistributedSampler as TorchSampler

import ddp_teach as dt
from ddp_teach.sampler import DistributedSampler, rank_indices

WORLD_SIZES = range(1, 6)
LENGTHS = range(0, 24)
EPOCHS = (0, 1, 2, 7)


def all_cases():
    return itertools.product(WORLD_SIZES, LENGTHS, (True, False), (True, False))


def test_same_indices_as_torch_every_case_and_epoch():
    checked = 0
    for world, length, shuffle, drop_last in all_cases():
        data = range(length)
        for rank in range(world):
            kwargs = dict(num_replicas=world, rank=rank, shuffle=shuffle,
                          seed=5, drop_last=drop_last)
            theirs, ours = TorchSampler(data, **kwargs), DistributedSampler(data, **kwargs)
            assert len(ours) == len(theirs), kwargs
            for epoch in EPOCHS:
                theirs.set_epoch(epoch)
                ours.set_epoch(epoch)
                expected = list(theirs)
                assert list(ours) == expected, (kwargs, epoch)
                assert rank_indices(length, world, rank, shuffle, 5, epoch,
                                    drop_last) == expected
                checked += 1
    assert checked == 2 * 2 * sum(WORLD_SIZES) * len(LENGTHS) * len(EPOCHS)


def test_every_rank_gets_the_same_number_and_no_duplicates():
    for world, length, shuffle, drop_last in all_cases():
        shares = [rank_indices(length, world, r, shuffle, 0, 3, drop_last)
                  for r in range(world)]
        assert len({len(s) for s in shares}) == 1
        everything = [i for s in shares for i in s]
        if drop_last:  # nothing seen twice, at most world - 1 left out
            assert len(set(everything)) == len(everything)
            assert length - len(everything) < world
        else:  # everything seen, at most world - 1 seen twice
            assert set(everything) == set(range(length))
            assert len(everything) - length < world
            if length >= world:  # padding comes from other ranks' shares
                assert all(len(set(s)) == len(s) for s in shares)


def test_epochs_shuffle_differently_and_seed_matters():
    first, second = (rank_indices(20, 2, 0, epoch=e) for e in (0, 1))
    assert first != second
    assert rank_indices(20, 2, 0, seed=1) != first
    assert rank_indices(20, 2, 0, shuffle=False) == list(range(0, 20, 2))


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_replicas=2, rank=2), "rank must be an int from 0 to 1"),
    (dict(num_replicas=2, rank=-1), "rank must be"),
    (dict(num_replicas=0, rank=0), "num_replicas must be a positive int"),
    (dict(num_replicas=2), "initialised default process group"),
    (dict(rank=0), "initialised default process group"),
    (dict(), "initialised default process group"),
])
def test_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DistributedSampler(range(10), **kwargs)


def test_rank_indices_checks_its_arguments():
    with pytest.raises(ValueError, match="rank must be"):
        rank_indices(10, 3, 3)


def sampler_from_process_group(rank, world_size):
    sampler = DistributedSampler(range(11), seed=3)
    sampler.set_epoch(2)
    return sampler.num_replicas, sampler.rank, list(sampler)


def test_defaults_come_from_the_process_group():
    results = dt.run(sampler_from_process_group, 3)
    for rank, (replicas, got_rank, indices) in enumerate(results):
        assert (replicas, got_rank) == (3, rank)
        expected = TorchSampler(range(11), 3, rank, seed=3)
        expected.set_epoch(2)
        assert indices == list(expected)
