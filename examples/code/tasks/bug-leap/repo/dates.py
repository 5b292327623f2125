def is_leap(year):
    return year % 4 == 0
