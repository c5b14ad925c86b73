"""Low-data 3-digit arithmetic: every operand pair 000-999, a seeded training fraction, the rest held out.

A sequence is the prompt `a2 a1 a0 OP b2 b1 b0 =` followed by the answer's digits, zero padded to a
fixed width (4 for addition, 6 for multiplication). The answer is written least significant digit
first (`reversed`, the default: each digit then depends only on digits already seen, as in carrying
by hand) or most significant first (`plain`). A causal model reads the whole sequence and is scored on
predicting the answer tokens; at evaluation it decodes them greedily from the prompt.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from maskjax.errors import ConfigError

DIGITS = 10
PLUS, TIMES, EQUALS = 10, 11, 12
VOCAB = 13
OPERAND_DIGITS = 3
PROMPT = 2 * OPERAND_DIGITS + 2  # a2 a1 a0 OP b2 b1 b0 =
FORMATS = ("reversed", "plain")


@dataclasses.dataclass(frozen=True)
class ArithmeticTask:
    """op: 'add' or 'mul'; answer_format: 'reversed' (least significant digit first) or 'plain'."""

    op: str
    answer_format: str = "reversed"

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ConfigError(f"unknown op {self.op!r}; known: {', '.join(OPS)}")
        if self.answer_format not in FORMATS:
            raise ConfigError(f"unknown answer format {self.answer_format!r}; known: {', '.join(FORMATS)}")

    @property
    def answer_digits(self) -> int:
        return OPS[self.op][1]

    @property
    def length(self) -> int:
        return PROMPT + self.answer_digits

    def answer_places(self) -> np.ndarray:
        """The place value (0 = units) of each answer position, in sequence order."""
        places = np.arange(self.answer_digits)
        return places if self.answer_format == "reversed" else places[::-1]


OPS = {"add": (PLUS, 4), "mul": (TIMES, 6)}


def operands() -> tuple[np.ndarray, np.ndarray]:
    """Every ordered pair (a, b) of 3-digit operands 000-999: two [10**6] arrays."""
    a, b = np.divmod(np.arange(10 ** (2 * OPERAND_DIGITS)), 10**OPERAND_DIGITS)
    return a, b


def digits(values: np.ndarray, width: int) -> np.ndarray:
    """[n, width] decimal digits, most significant first."""
    return (np.asarray(values)[:, None] // 10 ** np.arange(width - 1, -1, -1)) % 10


def sequences(task: ArithmeticTask, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Token sequences [n, task.length] (int32) for operand arrays a, b."""
    op_token, width = OPS[task.op]
    result = a + b if task.op == "add" else a * b
    answer = digits(result, width)
    if task.answer_format == "reversed":
        answer = answer[:, ::-1]
    n = len(a)
    return np.concatenate(
        [
            digits(a, OPERAND_DIGITS),
            np.full((n, 1), op_token),
            digits(b, OPERAND_DIGITS),
            np.full((n, 1), EQUALS),
            answer,
        ],
        axis=1,
    ).astype(np.int32)


def decode_answer(task: ArithmeticTask, answer_tokens: np.ndarray) -> np.ndarray:
    """The integer an answer (digit tokens [n, answer_digits], in the task's format) spells."""
    answer = np.asarray(answer_tokens)
    if task.answer_format == "reversed":
        answer = answer[:, ::-1]
    return (answer * 10 ** np.arange(answer.shape[1] - 1, -1, -1)).sum(axis=1)


def split(train_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, held_out) indices into `operands()`: a seeded random subset of round(fraction * 10**6)
    pairs and every other pair. Every pair lands in exactly one of the two."""
    if not 0.0 < train_fraction < 1.0:
        raise ConfigError(f"training fraction must lie in (0, 1), got {train_fraction}")
    total = 10 ** (2 * OPERAND_DIGITS)
    n_train = max(1, round(train_fraction * total))
    order = np.random.default_rng(seed).permutation(total)
    return np.sort(order[:n_train]), np.sort(order[n_train:])


def place_value_pattern(task: ArithmeticTask) -> np.ndarray:
    """The mask prior's open entries [length, length] (queries down, keys across), causal.

    In a causal model position t predicts token t + 1, so the query that writes an answer digit of
    place p is the position just before it (`=` for the first answer digit). It opens to the operand
    digits that determine place p: for addition the operands' places <= p (the same place and the
    carries from below); for multiplication the digits a_i, b_k of every pair with i + k <= p, which is
    every operand place <= p. Every position also sees itself and the `=` and operator tokens, and the
    answer digits already written; prompt positions see the prompt causally (their predictions are
    not scored). Nothing above the diagonal is open: the causal mask stays hard on top.
    """
    length = task.length
    open_ = np.tril(np.ones((length, length), bool))
    operand_place = np.full(length, -1)
    operand_place[0:OPERAND_DIGITS] = np.arange(OPERAND_DIGITS - 1, -1, -1)
    operand_place[OPERAND_DIGITS + 1 : 2 * OPERAND_DIGITS + 1] = np.arange(OPERAND_DIGITS - 1, -1, -1)
    is_operand = operand_place >= 0
    for offset, place in enumerate(task.answer_places()):
        query = PROMPT - 1 + offset
        open_[query, is_operand] = operand_place[is_operand] <= place
    return open_


def mask_pattern(task: ArithmeticTask, kind: str, seed: int = 0) -> np.ndarray:
    """The task's mask pattern of a kind: only the place-value "oracle" has a meaning here."""
    del seed
    if kind != "oracle":
        raise ConfigError(f"the {kind} mask is not defined for arithmetic; only the oracle (place-value) mask is")
    return place_value_pattern(task)
