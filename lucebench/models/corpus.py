"""The embedded training text of the synthetic tokenizer: English prose, arithmetic word problems and code.

Kept in the package (not downloaded) so that the tokenizer, and with it every synthetic checkpoint, is
the same on every machine. The hand-written passages are extended by deterministic template text.
"""

from __future__ import annotations

import random

_PROSE = """\
The benchmark measures how fast a language model turns a prompt into text. It reports two numbers for
each run: the time to process the prompt, called prefill, and the rate at which new tokens appear,
called decode. A careful measurement repeats each request several times, discards the first warm-up
runs, and keeps every raw sample so that anyone can check the summary later.

Energy matters as much as speed. A graphics card that draws three hundred watts while producing four
hundred tokens per second spends less than one joule per token. The counter inside the card adds up
the energy it used since the driver was loaded; reading it before and after a phase gives the energy
of that phase without guessing the average power.

When two engines are compared, they must receive the same token ids and generate the same number of
tokens. Greedy decoding picks the most likely token at every step, so two correct engines should agree
on the output, apart from rare ties that floating-point rounding can flip. A report that hides these
details is not reproducible, and a number that cannot be reproduced is only an anecdote.

Once upon a time a small robot lived in a workshop full of old radios. Every morning it opened the
window, counted the birds on the roof, and wrote the number in a notebook. On rainy days there were
no birds at all, so the robot wrote a zero and drew a little cloud next to it. After a year the
notebook was full, and the robot learned that birds prefer sunny mornings in spring.

The river flows from the mountains to the sea. Along the way it passes through forests, farms and
three small towns. People fish from the old stone bridge, children swim in the shallow bends during
summer, and in winter the edges freeze into thin sheets of ice that crack under the lightest step.

Question: A train travels 120 kilometers in 2 hours. What is its average speed?
Answer: The speed is the distance divided by the time, so 120 / 2 = 60 kilometers per hour.

Question: Mary has 5 apples and buys 7 more. She gives 3 to her brother. How many apples does she have?
Answer: 5 + 7 = 12, and 12 - 3 = 9. Mary has 9 apples.

Problem: Find the value of x if 3x + 5 = 20.
Solution: Subtract 5 from both sides to get 3x = 15, then divide by 3. The answer is \\boxed{5}.

The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. How vexingly
quick daft zebras jump! Sphinx of black quartz, judge my vow. The five boxing wizards jump quickly.
"""

_CODE = '''\
def fibonacci(n: int) -> int:
    """Return the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    i = 2
    while i * i <= n:
        if n % i == 0:
            return False
        i += 1
    return True


class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from empty stack")
        return self.items.pop()

    def __len__(self):
        return len(self.items)


def has_close_elements(numbers: list[float], threshold: float) -> bool:
    """Check if any two numbers in the list are closer to each other than the threshold."""
    for i, a in enumerate(numbers):
        for j, b in enumerate(numbers):
            if i != j and abs(a - b) < threshold:
                return True
    return False


import json
import os
from pathlib import Path


def load_config(path: str) -> dict:
    with open(path, "r", encoding="utf-8") as f:
        return json.load(f)


def main():
    config = load_config(os.environ.get("CONFIG", "config.json"))
    for key, value in sorted(config.items()):
        print(f"{key} = {value}")


if __name__ == "__main__":
    main()
'''

_C_CODE = """\
#include <stdio.h>
#include <stdlib.h>

static int sum(const int *values, size_t n) {
    int total = 0;
    for (size_t i = 0; i < n; ++i) {
        total += values[i];
    }
    return total;
}

int main(int argc, char **argv) {
    int values[4] = {1, 2, 3, 4};
    printf("sum = %d\\n", sum(values, 4));
    return argc > 1 ? atoi(argv[1]) : 0;
}

__global__ void add(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""

_NAMES = ["Alice", "Bob", "Carmen", "David", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas"]
_THINGS = ["apples", "books", "marbles", "pencils", "coins", "stickers", "cookies", "stamps"]
_VERBS = ["buys", "finds", "receives", "collects", "makes"]
_FUNCS = ["count", "total", "merge", "parse", "render", "scale", "filter", "update", "reduce", "lookup"]
_NOUNS = ["items", "values", "tokens", "rows", "words", "nodes", "layers", "scores", "blocks", "lines"]


def _word_problems(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        name, thing, verb = rng.choice(_NAMES), rng.choice(_THINGS), rng.choice(_VERBS)
        a, b, c = rng.randint(2, 60), rng.randint(2, 60), rng.randint(1, 20)
        out.append(
            f"Question: {name} has {a} {thing} and {verb} {b} more. Then {name} gives away {c}. "
            f"How many {thing} are left?\nAnswer: {a} + {b} = {a + b}, and {a + b} - {c} = {a + b - c}. "
            f"The answer is {a + b - c}.\n"
        )
    return out


def _functions(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        f, x = rng.choice(_FUNCS), rng.choice(_NOUNS)
        k = rng.randint(1, 9)
        out.append(
            f"def {f}_{x}({x}: list[int]) -> int:\n"
            f'    """{f.capitalize()} the {x} and return the result."""\n'
            f"    result = 0\n"
            f"    for item in {x}:\n"
            f"        if item % {k} == 0:\n"
            f"            result += item\n"
            f"    return result\n\n"
        )
    return out


def corpus() -> list[str]:
    """The training texts, identical on every call and every machine."""
    rng = random.Random(20240531)
    texts = [_PROSE, _CODE, _C_CODE]
    texts += _word_problems(rng, 300)
    texts += _functions(rng, 300)
    # Repeat the hand-written text so that its words outrank template noise in the merge order.
    return texts * 1 + [_PROSE, _CODE, _C_CODE] * 3
