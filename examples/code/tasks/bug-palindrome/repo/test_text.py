from text import is_palindrome


def test_plain():
    assert is_palindrome("level")


def test_case_and_spaces():
    assert is_palindrome("Never odd or even")


def test_not():
    assert not is_palindrome("forge")
