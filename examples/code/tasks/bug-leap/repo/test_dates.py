from dates import is_leap


def test_ordinary():
    assert is_leap(2024) and not is_leap(2023)


def test_centuries():
    assert not is_leap(1900) and is_leap(2000)
