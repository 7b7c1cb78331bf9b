"""Multi-step arithmetic word problems, generated from a structure and then told as a story.

A problem is first drawn as numbers only: a starting quantity and 1 to N steps, each an operation
(add, sub, mul, div) with its amount, every intermediate value a whole number in
[1, max_value]. Only then is it put into words (people, objects, buying, giving, sharing,
"times as many", boxes of ...). The answer is computed from the structure, never read back from
the text, so a template that told the story wrong could not make the answer key wrong with it
(tests/test_word_math.py recomputes every answer from `start` and `steps`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Op = str  # "add", "sub", "mul" or "div"
SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/"}

# (name, subject pronoun, possessive): the people a story is about
PEOPLE = (
    ("Tom", "he", "his"),
    ("Anna", "she", "her"),
    ("Ben", "he", "his"),
    ("Lily", "she", "her"),
    ("Sam", "he", "his"),
    ("Mia", "she", "her"),
    ("Leo", "he", "his"),
    ("Emma", "she", "her"),
    ("Omar", "he", "his"),
    ("Priya", "she", "her"),
    ("Carlos", "he", "his"),
    ("Yuki", "she", "her"),
    ("Jack", "he", "his"),
    ("Nora", "she", "her"),
)
# (singular, plural): what they count
OBJECTS = (
    ("apple", "apples"),
    ("marble", "marbles"),
    ("sticker", "stickers"),
    ("cookie", "cookies"),
    ("book", "books"),
    ("pencil", "pencils"),
    ("coin", "coins"),
    ("stamp", "stamps"),
    ("seashell", "seashells"),
    ("trading card", "trading cards"),
    ("balloon", "balloons"),
    ("toy car", "toy cars"),
    ("cupcake", "cupcakes"),
    ("crayon", "crayons"),
)
# (singular, plural): what "groups of" come in
CONTAINERS = (("box", "boxes"), ("bag", "bags"), ("jar", "jars"), ("pack", "packs"))
# Words that open a later step's sentence ("" leaves it bare); never the same twice in a row
CONNECTORS = ("", "Then ", "After that, ", "Later, ", "Next, ")


@dataclass(frozen=True)
class Settings:
    """The generator's knobs (BenchmarkConfig's word_math keys, already checked)."""

    steps: tuple[int, ...]
    step_weights: tuple[float, ...]
    step_ops: tuple[Op, ...]
    start_range: tuple[int, int]
    operand_range: tuple[int, int]  # amounts added or taken away
    factor_range: tuple[int, int]  # multipliers and divisors
    max_value: int  # every value along the way stays within 1..max_value


@dataclass(frozen=True)
class WordProblem:
    start: int
    steps: tuple[tuple[Op, int], ...]
    question: str
    solution: str  # a worked solution ending "The answer is N." (model=reference, MPO's warm-up)

    @property
    def answer(self) -> int:
        return apply_steps(self.start, self.steps)


def apply_steps(start: int, steps: Sequence[tuple[Op, int]]) -> int:
    """The value after the steps (exact: the generator only divides where it divides evenly)."""
    value = start
    for op, amount in steps:
        if op == "add":
            value += amount
        elif op == "sub":
            value -= amount
        elif op == "mul":
            value *= amount
        elif op == "div":
            quotient, remainder = divmod(value, amount)
            if remainder:
                raise ValueError(f"{value} / {amount} is not a whole number")
            value = quotient
        else:
            raise ValueError(f"unknown operation {op!r}")
    return value


def _amounts(op: Op, value: int, s: Settings) -> list[int]:
    """The amounts `op` may take at `value`, keeping the next value whole and in 1..max_value."""
    low, high = s.operand_range if op in ("add", "sub") else s.factor_range
    if op == "add":
        return list(range(low, min(high, s.max_value - value) + 1))
    if op == "sub":
        return list(range(low, min(high, value - 1) + 1))
    if op == "mul":
        return [k for k in range(low, high + 1) if value * k <= s.max_value]
    return [k for k in range(low, high + 1) if value % k == 0 and value // k >= 1]


def draw_structure(rng: random.Random, s: Settings) -> tuple[int, tuple[tuple[Op, int], ...]]:
    """A start value and steps; the step count follows the weights exactly. An operation with no
    allowed amount at the current value (7 does not divide by 2..5) is not drawn there; a walk
    where none is allowed starts over (only possible with narrow ranges)."""
    count = rng.choices(s.steps, weights=s.step_weights)[0]
    for _ in range(1000):
        start = value = rng.randint(*s.start_range)
        steps: list[tuple[Op, int]] = []
        while len(steps) < count:
            options = [(op, amounts) for op in s.step_ops if (amounts := _amounts(op, value, s))]
            if not options:
                break
            op, amounts = rng.choice(options)
            steps.append((op, rng.choice(amounts)))
            value = apply_steps(value, steps[-1:])
        if len(steps) == count:
            return start, tuple(steps)
    raise ValueError(f"no {count}-step problem fits these ranges")


def draw_problem(rng: random.Random, s: Settings) -> WordProblem:
    start, steps = draw_structure(rng, s)
    return WordProblem(start, steps, tell(rng, start, steps), worked_solution(start, steps))


def worked_solution(start: int, steps: Sequence[tuple[Op, int]]) -> str:
    """One line per step with its arithmetic, then the sentence the grader reads."""
    lines = [f"Start with {start}."]
    value = start
    for number, (op, amount) in enumerate(steps, 1):
        after = apply_steps(value, [(op, amount)])
        lines.append(f"Step {number}: {value} {SYMBOL[op]} {amount} = {after}.")
        value = after
    lines.append(f"The answer is {value}.")
    return "\n".join(lines)


class _Story:
    """The running story: who holds the objects now, and how to name them in the next sentence."""

    def __init__(self, rng: random.Random) -> None:
        self.cast = rng.sample(PEOPLE, 3)
        self.holder = 0  # index into cast
        self.pronoun_ok = False  # the last sentence named the holder only: "he"/"she" is clear
        self.thing, self.things = rng.choice(OBJECTS)
        self.container = rng.choice(CONTAINERS)
        self.sentences: list[str] = []
        self.each_friend = False  # the last step shared them out: the question asks per friend

    @property
    def name(self) -> str:
        return self.cast[self.holder][0]

    @property
    def other(self) -> str:
        return self.cast[(self.holder + 1) % len(self.cast)][0]

    def objects(self, count: int) -> str:
        return f"{count} {self.thing if count == 1 else self.things}"

    def more(self, count: int) -> str:
        return f"{count} more {self.thing if count == 1 else self.things}"

    def say(self, text: str, connector: str = "", pronoun_ok: bool = True) -> None:
        """One sentence; `{S}` is the holder as subject (a pronoun when unambiguous)."""
        subject = self.cast[self.holder][1] if self.pronoun_ok else self.name
        if connector:
            sentence = connector + text.replace("{S}", subject)
        else:
            sentence = text.replace("{S}", subject[0].upper() + subject[1:])
        self.sentences.append(sentence)
        self.pronoun_ok = pronoun_ok


Template = Callable[[_Story, int, str], None]  # (story, amount, connector) -> tells one step


def _add_buys(story: _Story, n: int, connector: str) -> None:
    story.say(f"{{S}} buys {n} more.", connector)


def _add_finds(story: _Story, n: int, connector: str) -> None:
    story.say(f"{{S}} finds {story.more(n)}.", connector)


def _add_gift(story: _Story, n: int, connector: str) -> None:
    story.say(f"{story.other} gives {story.name} {story.objects(n)}.", connector, pronoun_ok=False)


def _add_wins(story: _Story, n: int, connector: str) -> None:
    story.say(f"{{S}} wins another {story.objects(n)} in a game.", connector)


def _sub_gives_away(story: _Story, n: int, connector: str) -> None:
    story.say(f"{{S}} gives away {story.objects(n)}.", connector)


def _sub_loses(story: _Story, n: int, connector: str) -> None:
    story.say(f"{{S}} loses {n} of them.", connector)


def _sub_gives_to(story: _Story, n: int, connector: str) -> None:
    story.say(f"{{S}} gives {story.objects(n)} to {story.other}.", connector, pronoun_ok=False)


def _sub_sells(story: _Story, n: int, connector: str) -> None:
    story.say(f"{{S}} sells {story.objects(n)}.", connector)


def _mul_times_as_many(story: _Story, k: int, connector: str) -> None:
    del connector  # a second person enters: the sentence opens with their name, no "Then"
    story.say(f"{story.other} has {k} times as many {story.things} as {story.name}.")
    story.holder = (story.holder + 1) % len(story.cast)
    story.pronoun_ok = False  # two people named: the next sentence names its subject


def _mul_grows(story: _Story, k: int, connector: str) -> None:
    pronoun = story.cast[story.holder][1]
    story.say(f"{{S}} buys more until {pronoun} has {k} times as many as before.", connector)


def _div_piles(story: _Story, k: int, connector: str) -> None:
    story.say(f"{{S}} splits them into {k} equal piles and keeps one pile.", connector)


def _div_half(story: _Story, k: int, connector: str) -> None:
    story.say(f"{{S}} gives half of them to {story.other}.", connector, pronoun_ok=False)


def _div_share(story: _Story, k: int, connector: str) -> None:
    story.say(f"{{S}} shares them equally among {k} friends.", connector)
    story.each_friend = True


TEMPLATES: dict[Op, tuple[Template, ...]] = {
    "add": (_add_buys, _add_finds, _add_gift, _add_wins),
    "sub": (_sub_gives_away, _sub_loses, _sub_gives_to, _sub_sells),
    "mul": (_mul_times_as_many, _mul_grows),
    "div": (_div_piles,),
}


def _templates(op: Op, amount: int, last: bool) -> tuple[Template, ...]:
    """The phrasings that fit: halves only for 2, sharing out only as the last step (the question
    then asks what each friend gets)."""
    extra: tuple[Template, ...] = ()
    if op == "div" and amount == 2:
        extra += (_div_half,)
    if op == "div" and last:
        extra += (_div_share,)
    return TEMPLATES[op] + extra


def tell(rng: random.Random, start: int, steps: Sequence[tuple[Op, int]]) -> str:
    """The story of `start` and `steps`, ending with its question."""
    story = _Story(rng)
    rest = list(steps)
    if rest and rest[0][0] == "mul" and rng.random() < 0.5:  # "4 boxes with 6 apples in each"
        k = rest.pop(0)[1]
        box, boxes = story.container
        story.say(
            f"{story.name} has {start} {box if start == 1 else boxes} with "
            f"{story.objects(k)} in each {box}."
        )
    else:
        opening = rng.choice(("{S} has {x}.", "{S} starts with {x}.", "{S} owns {x}."))
        story.say(opening.replace("{x}", story.objects(start)))
    connector = ""
    for index, (op, amount) in enumerate(rest):
        template = rng.choice(_templates(op, amount, last=index == len(rest) - 1))
        choices = CONNECTORS[:2] if index == 0 else CONNECTORS
        connector = rng.choice([word for word in choices if not word or word != connector])
        template(story, amount, connector)
    if story.each_friend:
        question = f"How many {story.things} does each friend get?"
    else:
        question = f"How many {story.things} does {story.name} have now?"
    return " ".join([*story.sentences, question])
