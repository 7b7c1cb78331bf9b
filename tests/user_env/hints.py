"""A helper module beside the plugin file: `guess_number.py` imports it as `import hints`."""

from __future__ import annotations


def hint(guess: int, answer: int) -> str:
    """What the player hears after a wrong guess."""
    return f"{guess} is too high. Guess again." if guess > answer else f"{guess} is too low."


def shaped(guesses: list[int], answer: int) -> float:
    """1 for a first-guess hit, 0.25 less per extra guess (0.25 at least); a miss earns
    0.2 / (1 + its distance), nothing without a guess."""
    if not guesses:
        return 0.0
    if guesses[-1] == answer:
        return max(0.25, 1.25 - 0.25 * len(guesses))
    return 0.2 / (1 + abs(guesses[-1] - answer))
