from fizz import fizzbuzz


def test_numbers():
    assert fizzbuzz(1) == "1" and fizzbuzz(3) == "Fizz" and fizzbuzz(5) == "Buzz"


def test_both():
    assert fizzbuzz(30) == "FizzBuzz"
