"""Answer extraction and equivalence for GSM8K and MATH-style answers.

MATH answers are LaTeX; equivalence is string equality after normalisation (\\dfrac -> \\frac, \\left/
\\right, spacing, \\text{} wrappers and units, degrees, dollars, trailing zeros), then numeric equality
(fractions, decimals, percentages; relative tolerance 1e-6), element-wise for tuples and intervals.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), nested braces respected; None when there is none."""
    best = None
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            best = text[m.end():i - 1]
    if best is None:
        m = re.search(r"\\boxed ([^\s$]+)", text)  # \boxed 5 (no braces)
        if m:
            best = m.group(1)
    return best


def parse_number(text: str) -> Fraction | None:
    """A plain number (commas, $, % and trailing dots allowed) as an exact Fraction, else None."""
    t = text.strip().replace(",", "").replace("$", "").rstrip(".").strip()
    t = t.removesuffix("\\%").removesuffix("%").strip()
    if not t:
        return None
    try:
        return Fraction(t)
    except (ValueError, ZeroDivisionError):
        return None


def gsm8k_gold(answer: str) -> str:
    """The gold number of a GSM8K answer: the text after `####`, commas removed."""
    return answer.split("####")[-1].strip().replace(",", "")


def gsm8k_predicted(output: str) -> str | None:
    """The model's number: from \\boxed{}, else after `####`, else the last number in the text."""
    boxed = last_boxed(output)
    if boxed is not None:
        nums = _NUMBER.findall(boxed.replace("\\!", ""))
        if nums:
            return nums[-1].replace(",", "")
    if "####" in output:
        nums = _NUMBER.findall(output.split("####", 1)[1])
        if nums:
            return nums[0].replace(",", "")
    nums = _NUMBER.findall(output)
    return nums[-1].replace(",", "").rstrip(".") if nums else None


def numbers_equal(a: str | None, b: str | None, rel_tol: float = 1e-6) -> bool:
    """Numeric equality of two number strings (exact for fractions, tolerant for floats)."""
    if a is None or b is None:
        return False
    x, y = parse_number(a), parse_number(b)
    if x is None or y is None:
        return False
    return x == y or math.isclose(float(x), float(y), rel_tol=rel_tol, abs_tol=1e-9)


def _fix_fracs(s: str) -> str:
    # \frac12 -> \frac{1}{2}, \frac1{2} -> \frac{1}{2}, \sqrt2 -> \sqrt{2}
    s = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac\s*(\d)\s*\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\frac\s*\{([^{}]*)\}\s*(\d)", r"\\frac{\1}{\2}", s)
    return re.sub(r"\\sqrt\s*(\d+|[a-z])", r"\\sqrt{\1}", s)


def normalize_math(answer: str) -> str:
    """A canonical string form of a MATH answer (spaces, \\left/\\right, \\dfrac, units, degrees, $)."""
    s = answer.strip()
    s = s.replace("\n", "").replace("\\!", "").replace("\\,", "").replace("\\;", "").replace("\\:", "")
    s = re.sub(r"\\(?:d|t)frac", r"\\frac", s)
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("°", "").replace("\\degree", "")
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = re.sub(r"\\text\{\s*(?:degrees?|units?|cm|m|km|inches|inch|feet|ft|meters?|cents?|dollars?|"
               r"square units|sq units|hours?|minutes?|seconds?|mph|days?|years?)\s*\}", "", s)
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox|operatorname)\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\s+", "", s)
    s = _fix_fracs(s)
    s = re.sub(r"^[a-zA-Z]\s*=", "", s) if len(s) > 2 and re.match(r"^[a-zA-Z]=", s) else s  # "x=5" -> "5"
    s = re.sub(r"(\d)\.0+(?!\d)", r"\1", s)  # 5.00 -> 5
    s = re.sub(r"(?<![\d}])\.(\d)", r"0.\1", s)  # .5 -> 0.5
    s = s.rstrip(".")
    if re.fullmatch(r"-?\d+/\d+", s):  # a/b -> \frac{a}{b}
        num, den = s.split("/")
        s = f"\\frac{{{num}}}{{{den}}}" if not num.startswith("-") else f"-\\frac{{{num[1:]}}}{{{den}}}"
    return s


def _latex_number(s: str) -> Fraction | None:
    """Value of a normalised answer that is a plain number or a (signed) \\frac of integers/decimals."""
    m = re.fullmatch(r"(-?)\\frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}", s)
    if m:
        try:
            value = Fraction(m.group(2)) / Fraction(m.group(3))
        except (ValueError, ZeroDivisionError):
            return None
        return -value if m.group(1) else value
    return parse_number(s)


def _split_top(s: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in s:
        depth += ch in "([{" and 1 or (ch in ")]}" and -1 or 0)
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


def math_equal(predicted: str | None, gold: str) -> bool:
    """Whether a predicted MATH answer equals the gold one (normalised strings, then numbers, then tuples)."""
    if predicted is None:
        return False
    a, b = normalize_math(predicted), normalize_math(gold)
    if a == b:
        return True
    x, y = _latex_number(a), _latex_number(b)
    if x is not None and y is not None:
        return x == y or math.isclose(float(x), float(y), rel_tol=1e-6, abs_tol=1e-9)
    # tuples / intervals / lists: same brackets, element-wise equal
    if len(a) > 1 and len(b) > 1 and a[0] == b[0] and a[-1] == b[-1] and a[0] in "([{" and a[-1] in ")]}":
        pa, pb = _split_top(a[1:-1]), _split_top(b[1:-1])
        if len(pa) > 1:  # each element is strictly shorter, so the recursion ends
            return len(pa) == len(pb) and all(math_equal(p, q) for p, q in zip(pa, pb))
    pa, pb = _split_top(a), _split_top(b)
    if len(pa) > 1:  # a bare list "3, 5"
        return len(pa) == len(pb) and all(math_equal(p, q) for p, q in zip(pa, pb))
    return False
