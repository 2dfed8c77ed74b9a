"""ray_lite.util.multiprocessing.Pool where Ray's Pool differs from the
standard library's: imap/imap_unordered hand back an item's error as its
result and go on; a non-iterable is one item, with a deprecation warning."""
import warnings

import pytest

from ray_lite.exceptions import RayDeprecationWarning, RayTaskError
from ray_lite.util.multiprocessing import Pool

ERROR_AT = (2, 7, 11)


def fails_at_some(x):
    if x in ERROR_AT:
        raise KeyError(f"item {x}")
    return x * 10


def plus_one(x):
    return x + 1


@pytest.fixture
def pool(rt):
    p = Pool(2)
    try:
        yield p
    finally:
        p.terminate()


def _check_results(results):
    assert len(results) == 13
    for x, result in enumerate(results):
        if x in ERROR_AT:
            # The function's error, as map would raise it: the user's class too.
            assert isinstance(result, RayTaskError) and isinstance(result, KeyError)
            assert f"item {x}" in str(result)
        else:
            assert result == x * 10


@pytest.mark.parametrize("chunksize", [1, 3, 13])
def test_imap_hands_back_an_items_error_and_goes_on(pool, chunksize):
    it = pool.imap(fails_at_some, range(13), chunksize=chunksize)
    results = [next(it) for _ in range(13)]
    _check_results(results)
    with pytest.raises(StopIteration):
        next(it)


@pytest.mark.parametrize("chunksize", [1, 4])
def test_imap_of_an_iterator_hands_back_errors_too(pool, chunksize):
    _check_results(list(pool.imap(fails_at_some, iter(range(13)), chunksize=chunksize)))


@pytest.mark.parametrize("chunksize", [1, 5])
def test_imap_unordered_hands_back_every_items_result(pool, chunksize):
    results = list(pool.imap_unordered(fails_at_some, range(13), chunksize=chunksize))
    assert len(results) == 13
    errors = sorted(str(r) for r in results if isinstance(r, Exception))
    assert len(errors) == len(ERROR_AT)
    assert all(isinstance(r, KeyError) for r in results if isinstance(r, Exception))
    assert sorted(r for r in results if not isinstance(r, Exception)) == \
        [x * 10 for x in range(13) if x not in ERROR_AT]


def test_an_exception_returned_by_the_function_is_a_value(pool):
    # Only what the function raises is an error; what it returns is passed on as is.
    returned = list(pool.imap(lambda x: ValueError(x), [1, 2], chunksize=2))
    assert [type(r) for r in returned] == [ValueError, ValueError]
    assert not any(isinstance(r, RayTaskError) for r in returned)


@pytest.mark.parametrize("method", ["imap", "imap_unordered"])
def test_a_non_iterable_is_one_item_with_a_deprecation_warning(pool, method):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        it = getattr(pool, method)(plus_one, 3)
    found = [w for w in caught if issubclass(w.category, RayDeprecationWarning)]
    assert len(found) == 1
    assert "Passing a non-iterable argument" in str(found[0].message)
    assert found[0].filename == __file__        # pointed at the caller's line
    assert list(it) == [4]


def test_map_still_raises_the_first_error(pool):
    with pytest.raises(KeyError, match="item 2"):
        pool.map(fails_at_some, range(13))
