from lists import flatten


def test_flat():
    assert flatten([1, 2]) == [1, 2]


def test_nested():
    assert flatten([1, [2, [3, [4]]]]) == [1, 2, 3, 4]
