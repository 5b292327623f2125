def is_palindrome(text):
    return text == text[::-1]
