"""Generated Python programming tasks with their solutions: the "code" domain of the assistant corpus.

Each task is a function stub (signature and docstring, as a user would write the request) followed by the body
that the docstring asks for, in the style of the shipped `code_tasks` prompts. The body follows from the stub:
which loop, which test, which value is returned is said by the docstring, so a small model can master the
mapping, as a served chat model masters its domain; what is left free (a name, the loop or the comprehension)
is the entropy a real assistant's code keeps. Deterministic: task i of seed s is the same on every machine.
"""
from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    prompt: str    # the stub: what the user writes
    response: str  # the body: what the assistant writes


# Element kinds: (noun plural, noun singular, parameter names, type annotation, loop variable names)
INT_KINDS = [
    ("numbers", "number", ["numbers", "nums", "values", "data"], "list", ["n", "x", "number", "value", "num"]),
    ("scores", "score", ["scores", "points", "marks"], "list", ["score", "s", "mark"]),
    ("ages", "age", ["ages", "years"], "list", ["age", "a", "years"]),
    ("prices", "price", ["prices", "costs", "amounts"], "list", ["price", "p", "cost", "amount"]),
    ("counts", "count", ["counts", "totals", "tallies"], "list", ["count", "c", "total"]),
    ("temperatures", "temperature", ["temperatures", "readings"], "list", ["t", "reading", "temp"]),
    ("weights", "weight", ["weights", "masses"], "list", ["weight", "w", "mass"]),
    ("sizes", "size", ["sizes", "lengths"], "list", ["size", "length"]),
    ("distances", "distance", ["distances", "steps"], "list", ["distance", "d", "step"]),
    ("votes", "vote", ["votes", "ballots"], "list", ["vote", "v"]),
]
STR_KINDS = [
    ("words", "word", ["words", "tokens", "vocabulary"], "list", ["word", "w", "token"]),
    ("names", "name", ["names", "people", "users"], "list", ["name", "person", "user"]),
    ("lines", "line", ["lines", "rows", "entries"], "list", ["line", "row", "entry"]),
    ("labels", "label", ["labels", "tags", "keys"], "list", ["label", "tag", "key"]),
    ("strings", "string", ["strings", "items", "texts"], "list", ["s", "text", "item"]),
    ("codes", "code", ["codes", "ids", "identifiers"], "list", ["code", "ident"]),
    ("titles", "title", ["titles", "headings"], "list", ["title", "heading"]),
    ("cities", "city", ["cities", "places", "towns"], "list", ["city", "place", "town"]),
    ("colors", "color", ["colors", "colours", "shades"], "list", ["color", "shade"]),
    ("emails", "email", ["emails", "addresses"], "list", ["email", "address"]),
]
LETTERS = "abcdefghijklmnoprstuwxyz"

# Integer predicates: (phrase in the docstring, expression on `{v}`, needs a constant)
INT_PREDICATES = [
    ("are even", "{v} % 2 == 0"),
    ("are odd", "{v} % 2 == 1"),
    ("are positive", "{v} > 0"),
    ("are negative", "{v} < 0"),
    ("are zero", "{v} == 0"),
    ("are greater than {k}", "{v} > {k}"),
    ("are less than {k}", "{v} < {k}"),
    ("are at least {k}", "{v} >= {k}"),
    ("are at most {k}", "{v} <= {k}"),
    ("are divisible by {d}", "{v} % {d} == 0"),
    ("are not divisible by {d}", "{v} % {d} != 0"),
    ("are between {lo} and {hi}", "{lo} <= {v} <= {hi}"),
    ("are equal to {k}", "{v} == {k}"),
]
STR_PREDICATES = [
    ("are empty", "{v} == \"\""),
    ("are not empty", "{v} != \"\""),
    ("are longer than {k} characters", "len({v}) > {k}"),
    ("are shorter than {k} characters", "len({v}) < {k}"),
    ("have exactly {k} characters", "len({v}) == {k}"),
    ("start with \"{c}\"", "{v}.startswith(\"{c}\")"),
    ("end with \"{c}\"", "{v}.endswith(\"{c}\")"),
    ("contain \"{c}\"", "\"{c}\" in {v}"),
    ("do not contain \"{c}\"", "\"{c}\" not in {v}"),
    ("are all upper case", "{v}.isupper()"),
    ("are all lower case", "{v}.islower()"),
    ("are made of digits", "{v}.isdigit()"),
    ("are made of letters", "{v}.isalpha()"),
]
INT_MAPS = [
    ("doubled", "{v} * 2", "double"),
    ("tripled", "{v} * 3", "triple"),
    ("squared", "{v} * {v}", "square"),
    ("increased by {k}", "{v} + {k}", "add_{k}_to"),
    ("decreased by {k}", "{v} - {k}", "subtract_{k}_from"),
    ("multiplied by {k}", "{v} * {k}", "scale"),
    ("negated", "-{v}", "negate"),
    ("halved, rounding down", "{v} // 2", "halve"),
    ("replaced by its absolute value", "abs({v})", "absolute"),
    ("replaced by its remainder modulo {d}", "{v} % {d}", "remainders"),
]
STR_MAPS = [
    ("in upper case", "{v}.upper()", "upper"),
    ("in lower case", "{v}.lower()", "lower"),
    ("reversed", "{v}[::-1]", "reverse"),
    ("with surrounding whitespace removed", "{v}.strip()", "strip"),
    ("capitalized", "{v}.capitalize()", "capitalize"),
    ("replaced by its length", "len({v})", "lengths_of"),
    ("replaced by its first character", "{v}[:1]", "initials_of"),
    ("with \"{c}\" added at the front", "\"{c}\" + {v}", "prefix"),
    ("with \"{c}\" added at the end", "{v} + \"{c}\"", "suffix"),
    ("repeated twice", "{v} * 2", "repeat"),
]

# Phrase -> short name fragment, so a function's name says what its docstring says.
_NAME_OF_PREDICATE = {
    "are even": "even", "are odd": "odd", "are positive": "positive", "are negative": "negative", "are zero": "zero",
    "are greater than {k}": "above", "are less than {k}": "below", "are at least {k}": "at_least",
    "are at most {k}": "at_most", "are divisible by {d}": "divisible", "are not divisible by {d}": "not_divisible",
    "are between {lo} and {hi}": "between", "are equal to {k}": "equal", "are empty": "empty",
    "are not empty": "non_empty", "are longer than {k} characters": "long", "are shorter than {k} characters": "short",
    "have exactly {k} characters": "sized", "start with \"{c}\"": "starting", "end with \"{c}\"": "ending",
    "contain \"{c}\"": "containing", "do not contain \"{c}\"": "without", "are all upper case": "upper",
    "are all lower case": "lower", "are made of digits": "numeric", "are made of letters": "alphabetic",
}


def _constants(rng: random.Random) -> dict:
    lo = rng.randint(0, 20)
    return {"k": rng.randint(1, 30) if rng.random() < 0.6 else rng.choice([10, 20, 25, 50, 100, 1000]),
            "d": rng.choice([2, 3, 4, 5, 6, 7, 8, 9, 10, 12]), "lo": lo, "hi": lo + rng.randint(5, 80),
            "c": rng.choice(LETTERS)}


def _kind(rng: random.Random, strings: bool):
    plural, singular, params, annotation, loop_vars = rng.choice(STR_KINDS if strings else INT_KINDS)
    return plural, singular, rng.choice(params), annotation, rng.choice(loop_vars)


def _stub(name: str, args: list[tuple[str, str]], returns: str, doc: str) -> str:
    signature = ", ".join(f"{a}: {t}" for a, t in args)
    return f"def {name}({signature}) -> {returns}:\n    \"\"\"{doc}\n    \"\"\"\n"


def _indent(lines: list[str]) -> str:
    return "".join("    " + line + "\n" for line in lines)


def _predicate_task(rng: random.Random) -> Task:
    strings = rng.random() < 0.5
    plural, singular, param, annotation, v = _kind(rng, strings)
    phrase, expr = rng.choice(STR_PREDICATES if strings else INT_PREDICATES)
    consts = _constants(rng)
    phrase, test = phrase.format(**consts), expr.format(v=v, **consts)
    frag = _NAME_OF_PREDICATE[[p for p, _ in (STR_PREDICATES if strings else INT_PREDICATES)
                               if p.format(**consts) == phrase][0]]
    shape = rng.choice(["count", "filter", "any", "all", "first", "index", "sum", "remove"]
                       if not strings else ["count", "filter", "any", "all", "first", "index", "remove"])
    if shape == "count":
        name = rng.choice([f"count_{frag}", f"count_{frag}_{plural}", f"num_{frag}_{plural}"])
        doc = rng.choice([f"Return how many {plural} in {param} {phrase}.",
                          f"Count the {plural} in {param} that {phrase}.",
                          f"Return the number of {plural} in {param} that {phrase}."])
        c = rng.choice(["count", "total", "matches", "found"])
        body = [f"{c} = 0", f"for {v} in {param}:", f"    if {test}:", f"        {c} += 1", f"return {c}"]
        if rng.random() < 0.3:
            body = [f"return sum(1 for {v} in {param} if {test})"]
        return Task(_stub(name, [(param, annotation)], "int", doc), _indent(body))
    if shape in ("filter", "remove"):
        keep = test if shape == "filter" else f"not ({test})"
        name = f"{frag}_{plural}" if shape == "filter" else f"drop_{frag}_{plural}"
        doc = (f"Return a list of the {plural} in {param} that {phrase}." if shape == "filter" else
               f"Return {param} without the {plural} that {phrase}, keeping the order of the rest.")
        if rng.random() < 0.5:
            r = rng.choice(["result", "kept", "selected", "out"])
            body = [f"{r} = []", f"for {v} in {param}:", f"    if {keep}:", f"        {r}.append({v})",
                    f"return {r}"]
        else:
            body = [f"return [{v} for {v} in {param} if {keep}]"]
        return Task(_stub(name, [(param, annotation)], "list", doc), _indent(body))
    if shape in ("any", "all"):
        name = f"any_{frag}" if shape == "any" else f"all_{frag}"
        doc = (f"Return True if {rng.choice(['any', 'at least one'])} {singular} in {param} {_singular_phrase(phrase)}."
               if shape == "any" else f"Return True if {rng.choice(['all the', 'every one of the'])} {plural} in "
               f"{param} {phrase}.")
        if shape == "any":
            body = [f"for {v} in {param}:", f"    if {test}:", "        return True", "return False"]
        else:
            body = [f"for {v} in {param}:", f"    if not ({test}):", "        return False", "return True"]
        if rng.random() < 0.3:
            body = [f"return {shape}({test} for {v} in {param})"]
        return Task(_stub(name, [(param, annotation)], "bool", doc), _indent(body))
    if shape == "first":
        name = f"first_{frag}_{singular}"
        doc = f"Return the first {singular} in {param} that {_singular_phrase(phrase)}, or None if there is none."
        body = [f"for {v} in {param}:", f"    if {test}:", f"        return {v}", "return None"]
        return Task(_stub(name, [(param, annotation)], "int" if not strings else "str", doc), _indent(body))
    if shape == "index":
        name = f"index_of_first_{frag}"
        doc = f"Return the position of the first {singular} in {param} that {_singular_phrase(phrase)}, or -1."
        body = [f"for i, {v} in enumerate({param}):", f"    if {test}:", "        return i", "return -1"]
        return Task(_stub(name, [(param, annotation)], "int", doc), _indent(body))
    name = f"sum_of_{frag}_{plural}"
    doc = f"Return the sum of the {plural} in {param} that {phrase}."
    body = ["total = 0", f"for {v} in {param}:", f"    if {test}:", f"        total += {v}", "return total"]
    if rng.random() < 0.3:
        body = [f"return sum({v} for {v} in {param} if {test})"]
    return Task(_stub(name, [(param, annotation)], "int", doc), _indent(body))


def _singular_phrase(phrase: str) -> str:
    """'are even' -> 'is even', 'have exactly' -> 'has exactly', 'start with' -> 'starts with'."""
    for plural, singular in (("are ", "is "), ("have ", "has "), ("start ", "starts "), ("end ", "ends "),
                             ("contain ", "contains "), ("do not ", "does not ")):
        if phrase.startswith(plural):
            return singular + phrase[len(plural):]
    return phrase


def _map_task(rng: random.Random) -> Task:
    strings = rng.random() < 0.5
    plural, singular, param, annotation, v = _kind(rng, strings)
    phrase, expr, frag = rng.choice(STR_MAPS if strings else INT_MAPS)
    consts = _constants(rng)
    phrase, value, frag = phrase.format(**consts), expr.format(v=v, **consts), frag.format(**consts)
    name = rng.choice([f"{frag}_{plural}", f"{frag}_all", f"{frag}_each"])
    doc = f"Return a new list with each {singular} of {param} {phrase}."
    if rng.random() < 0.5:
        body = [f"return [{value} for {v} in {param}]"]
    else:
        r = rng.choice(["result", "mapped", "out", "converted"])
        body = [f"{r} = []", f"for {v} in {param}:", f"    {r}.append({value})", f"return {r}"]
    return Task(_stub(name, [(param, annotation)], "list", doc), _indent(body))


def _reduce_task(rng: random.Random) -> Task:
    strings = rng.random() < 0.35
    plural, singular, param, annotation, v = _kind(rng, strings)
    if strings:
        which = rng.choice(["longest", "shortest", "join", "total_length", "count_char"])
        if which in ("longest", "shortest"):
            cmp = ">" if which == "longest" else "<"
            doc = f"Return the {which} {singular} in {param}, the first one if several tie, or None if it is empty."
            body = [f"if not {param}:", "    return None", f"best = {param}[0]", f"for {v} in {param}[1:]:",
                    f"    if len({v}) {cmp} len(best):", f"        best = {v}", "return best"]
            return Task(_stub(f"{which}_{singular}", [(param, annotation)], "str", doc), _indent(body))
        if which == "join":
            sep = rng.choice([", ", " ", "-", "\\n", "; "])
            doc = f"Return the {plural} of {param} joined into one string, separated by \"{sep}\"."
            return Task(_stub(f"join_{plural}", [(param, annotation)], "str", doc),
                        _indent([f"return \"{sep}\".join({param})"]))
        if which == "total_length":
            doc = f"Return the total number of characters in all the {plural} of {param}."
            body = ["total = 0", f"for {v} in {param}:", f"    total += len({v})", "return total"]
            return Task(_stub(f"total_length", [(param, annotation)], "int", doc), _indent(body))
        c = rng.choice(LETTERS)
        doc = f"Return how many times the letter \"{c}\" occurs in the {plural} of {param}."
        body = ["count = 0", f"for {v} in {param}:", f"    count += {v}.count(\"{c}\")", "return count"]
        return Task(_stub(f"count_letter_{c}", [(param, annotation)], "int", doc), _indent(body))
    which = rng.choice(["sum", "product", "maximum", "minimum", "mean", "range", "second"])
    if which == "sum":
        doc = f"Return the sum of the {plural} in {param}."
        body = ["total = 0", f"for {v} in {param}:", f"    total += {v}", "return total"]
        return Task(_stub(f"total_{singular}" if rng.random() < 0.5 else f"sum_{plural}", [(param, annotation)],
                          "int", doc), _indent(body))
    if which == "product":
        doc = f"Return the product of the {plural} in {param}, or 1 if it is empty."
        body = ["product = 1", f"for {v} in {param}:", f"    product *= {v}", "return product"]
        return Task(_stub(f"product_of_{plural}", [(param, annotation)], "int", doc), _indent(body))
    if which in ("maximum", "minimum"):
        cmp = ">" if which == "maximum" else "<"
        doc = f"Return the {'largest' if cmp == '>' else 'smallest'} {singular} in {param} without calling {which[:3]}."
        body = [f"best = {param}[0]", f"for {v} in {param}[1:]:", f"    if {v} {cmp} best:", f"        best = {v}",
                "return best"]
        return Task(_stub(f"{which}_{singular}", [(param, annotation)], "int", doc), _indent(body))
    if which == "mean":
        doc = f"Return the mean of the {plural} in {param}, or 0.0 if it is empty."
        body = [f"if not {param}:", "    return 0.0", f"return sum({param}) / len({param})"]
        return Task(_stub(f"mean_{singular}", [(param, annotation)], "float", doc), _indent(body))
    if which == "range":
        doc = f"Return the difference between the largest and the smallest {singular} in {param}."
        return Task(_stub(f"{singular}_range", [(param, annotation)], "int", doc),
                    _indent([f"return max({param}) - min({param})"]))
    doc = f"Return the second largest distinct {singular} in {param}, or None if there is none."
    body = [f"distinct = sorted(set({param}))", "if len(distinct) < 2:", "    return None", "return distinct[-2]"]
    return Task(_stub(f"second_largest_{singular}", [(param, annotation)], "int", doc), _indent(body))


def _dict_task(rng: random.Random) -> Task:
    plural, singular, param, annotation, v = _kind(rng, strings=True)
    which = rng.choice(["frequencies", "group_length", "group_first", "index", "lengths", "invert", "filter_values",
                        "merge", "keys_sorted"])
    if which == "frequencies":
        doc = f"Map each {singular} of {param} to the number of times it occurs."
        body = ["counts = {}", f"for {v} in {param}:", f"    counts[{v}] = counts.get({v}, 0) + 1", "return counts"]
        return Task(_stub(f"{singular}_frequencies", [(param, annotation)], "dict", doc), _indent(body))
    if which in ("group_length", "group_first"):
        key = f"len({v})" if which == "group_length" else f"{v}[0]"
        what = "length" if which == "group_length" else "first letter"
        doc = f"Group the {plural} of {param} by their {what}, in a dictionary of lists."
        body = ["groups = {}", f"for {v} in {param}:", f"    groups.setdefault({key}, []).append({v})",
                "return groups"]
        return Task(_stub(f"group_by_{what.replace(' ', '_')}", [(param, annotation)], "dict", doc), _indent(body))
    if which == "index":
        doc = f"Map each {singular} of {param} to its position in the list."
        body = [f"return {{{v}: i for i, {v} in enumerate({param})}}"]
        return Task(_stub(f"index_{plural}", [(param, annotation)], "dict", doc), _indent(body))
    if which == "lengths":
        doc = f"Map each {singular} of {param} to its length."
        body = [f"return {{{v}: len({v}) for {v} in {param}}}"]
        return Task(_stub(f"{singular}_lengths", [(param, annotation)], "dict", doc), _indent(body))
    mapping = rng.choice(["mapping", "table", "lookup", "data"])
    if which == "invert":
        doc = f"Return a new dictionary with the keys and values of {mapping} swapped."
        body = ["inverted = {}", f"for key, value in {mapping}.items():", "    inverted[value] = key", "return inverted"]
        return Task(_stub("invert", [(mapping, "dict")], "dict", doc), _indent(body))
    if which == "filter_values":
        consts = _constants(rng)
        phrase, expr = rng.choice(INT_PREDICATES[:9])
        phrase, test = phrase.format(**consts), expr.format(v="value", **consts)
        doc = f"Return the entries of {mapping} whose values {phrase}."
        body = [f"return {{key: value for key, value in {mapping}.items() if {test}}}"]
        return Task(_stub(f"{_NAME_OF_PREDICATE[[p for p, _ in INT_PREDICATES if p.format(**consts) == phrase][0]]}"
                          f"_entries", [(mapping, "dict")], "dict", doc), _indent(body))
    if which == "merge":
        doc = "Return a new dictionary with the entries of base, updated by those of extra."
        body = ["merged = dict(base)", "for key, value in extra.items():", "    merged[key] = value", "return merged"]
        return Task(_stub("merge", [("base", "dict"), ("extra", "dict")], "dict", doc), _indent(body))
    doc = f"Return the keys of {mapping} sorted by their values, smallest first."
    body = [f"return sorted({mapping}, key={mapping}.get)"]
    return Task(_stub("keys_by_value", [(mapping, "dict")], "list", doc), _indent(body))


def _text_task(rng: random.Random) -> Task:
    param = rng.choice(["text", "sentence", "line", "word", "message"])
    which = rng.choice(["vowels", "count_char", "reverse_words", "remove_char", "replace_char", "palindrome",
                        "words", "first_word", "capitalize_words", "no_spaces", "digits", "title"])
    c = rng.choice(LETTERS)
    if which == "vowels":
        doc = f"Return the number of vowels in {param}, upper or lower case."
        body = ["count = 0", f"for ch in {param}.lower():", "    if ch in \"aeiou\":", "        count += 1",
                "return count"]
        return Task(_stub("count_vowels", [(param, "str")], "int", doc), _indent(body))
    if which == "count_char":
        doc = f"Return how many times the character \"{c}\" occurs in {param}."
        return Task(_stub(f"count_{c}", [(param, "str")], "int", doc), _indent([f"return {param}.count(\"{c}\")"]))
    if which == "reverse_words":
        doc = f"Return {param} with the order of its words reversed."
        return Task(_stub("reverse_words", [(param, "str")], "str", doc),
                    _indent([f"return \" \".join(reversed({param}.split()))"]))
    if which == "remove_char":
        doc = f"Return {param} with every \"{c}\" removed."
        return Task(_stub(f"remove_{c}", [(param, "str")], "str", doc),
                    _indent([f"return {param}.replace(\"{c}\", \"\")"]))
    if which == "replace_char":
        d = rng.choice([x for x in LETTERS if x != c])
        doc = f"Return {param} with every \"{c}\" replaced by \"{d}\"."
        return Task(_stub(f"replace_{c}_with_{d}", [(param, "str")], "str", doc),
                    _indent([f"return {param}.replace(\"{c}\", \"{d}\")"]))
    if which == "palindrome":
        doc = f"Return True if {param} reads the same forwards and backwards, ignoring case."
        body = [f"cleaned = {param}.lower()", "return cleaned == cleaned[::-1]"]
        return Task(_stub("is_palindrome", [(param, "str")], "bool", doc), _indent(body))
    if which == "words":
        doc = f"Return the number of words in {param}."
        return Task(_stub("word_count", [(param, "str")], "int", doc), _indent([f"return len({param}.split())"]))
    if which == "first_word":
        doc = f"Return the first word of {param}, or an empty string if it has none."
        body = [f"words = {param}.split()", "if not words:", "    return \"\"", "return words[0]"]
        return Task(_stub("first_word", [(param, "str")], "str", doc), _indent(body))
    if which == "capitalize_words":
        doc = f"Return {param} with the first letter of every word in upper case."
        body = [f"words = {param}.split()", "return \" \".join(w[:1].upper() + w[1:] for w in words)"]
        return Task(_stub("capitalize_words", [(param, "str")], "str", doc), _indent(body))
    if which == "no_spaces":
        doc = f"Return {param} without any spaces."
        return Task(_stub("remove_spaces", [(param, "str")], "str", doc),
                    _indent([f"return {param}.replace(\" \", \"\")"]))
    if which == "digits":
        doc = f"Return the digits of {param} as one string, in order."
        body = [f"return \"\".join(ch for ch in {param} if ch.isdigit())"]
        return Task(_stub("only_digits", [(param, "str")], "str", doc), _indent(body))
    doc = f"Return {param} with its first character in upper case and the rest in lower case."
    return Task(_stub("sentence_case", [(param, "str")], "str", doc),
                _indent([f"return {param}[:1].upper() + {param}[1:].lower()"]))


def _number_task(rng: random.Random) -> Task:
    n = rng.choice(["n", "number", "value", "x"])
    which = rng.choice(["factorial", "fibonacci", "is_prime", "gcd", "digits_sum", "sum_to", "is_even", "sign",
                        "clamp", "power", "count_digits", "reverse_number", "squares", "divisors", "collatz"])
    if which in ("factorial", "fibonacci", "is_prime", "gcd", "digits_sum"):
        return _number_loop_task(rng, n, which)
    return _number_rule_task(n, which)


def _number_loop_task(rng: random.Random, n: str, which: str) -> Task:
    if which == "factorial":
        doc = f"Return {n} factorial, computed with a loop."
        body = ["result = 1", f"for i in range(2, {n} + 1):", "    result *= i", "return result"]
        return Task(_stub("factorial", [(n, "int")], "int", doc), _indent(body))
    if which == "fibonacci":
        doc = f"Return the first {n} Fibonacci numbers, starting with 0 and 1."
        body = ["result = []", "a, b = 0, 1", f"for _ in range({n}):", "    result.append(a)", "    a, b = b, a + b",
                "return result"]
        return Task(_stub("fibonacci", [(n, "int")], "list", doc), _indent(body))
    if which == "is_prime":
        doc = f"Return True if {n} is a prime number."
        body = [f"if {n} < 2:", "    return False", "i = 2", f"while i * i <= {n}:", f"    if {n} % i == 0:",
                "        return False", "    i += 1", "return True"]
        return Task(_stub("is_prime", [(n, "int")], "bool", doc), _indent(body))
    if which == "gcd":
        a, b = rng.choice([("a", "b"), ("x", "y"), ("first", "second")])
        doc = f"Return the greatest common divisor of {a} and {b} using Euclid's algorithm."
        body = [f"while {b}:", f"    {a}, {b} = {b}, {a} % {b}", f"return {a}"]
        return Task(_stub("gcd", [(a, "int"), (b, "int")], "int", doc), _indent(body))
    if which == "digits_sum":
        doc = f"Return the sum of the decimal digits of {n}."
        body = ["total = 0", f"{n} = abs({n})", f"while {n} > 0:", f"    total += {n} % 10", f"    {n} //= 10",
                "return total"]
        return Task(_stub("digits_sum", [(n, "int")], "int", doc), _indent(body))
    raise ValueError(f"not a looping number task: {which}")


def _number_rule_task(n: str, which: str) -> Task:
    if which == "sum_to":
        doc = f"Return the sum of the whole numbers from 1 to {n}."
        body = ["total = 0", f"for i in range(1, {n} + 1):", "    total += i", "return total"]
        return Task(_stub("sum_to", [(n, "int")], "int", doc), _indent(body))
    if which == "is_even":
        doc = f"Return True if {n} is even."
        return Task(_stub("is_even", [(n, "int")], "bool", doc), _indent([f"return {n} % 2 == 0"]))
    if which == "sign":
        doc = f"Return 1 if {n} is positive, -1 if it is negative and 0 if it is zero."
        body = [f"if {n} > 0:", "    return 1", f"if {n} < 0:", "    return -1", "return 0"]
        return Task(_stub("sign", [(n, "int")], "int", doc), _indent(body))
    if which == "clamp":
        doc = f"Return {n} limited to the range from low to high."
        body = [f"if {n} < low:", "    return low", f"if {n} > high:", "    return high", f"return {n}"]
        return Task(_stub("clamp", [(n, "float"), ("low", "float"), ("high", "float")], "float", doc), _indent(body))
    if which == "power":
        doc = f"Return {n} raised to the power exponent, computed with a loop."
        body = ["result = 1", "for _ in range(exponent):", f"    result *= {n}", "return result"]
        return Task(_stub("power", [(n, "int"), ("exponent", "int")], "int", doc), _indent(body))
    if which == "count_digits":
        doc = f"Return the number of decimal digits of {n}."
        return Task(_stub("count_digits", [(n, "int")], "int", doc), _indent([f"return len(str(abs({n})))"]))
    if which == "reverse_number":
        doc = f"Return the number whose decimal digits are those of {n} in reverse order."
        return Task(_stub("reverse_number", [(n, "int")], "int", doc), _indent([f"return int(str({n})[::-1])"]))
    if which == "squares":
        doc = f"Return the squares of the numbers from 1 to {n}."
        return Task(_stub("squares", [(n, "int")], "list", doc),
                    _indent([f"return [i * i for i in range(1, {n} + 1)]"]))
    if which == "divisors":
        doc = f"Return the positive divisors of {n}, in increasing order."
        body = [f"return [i for i in range(1, {n} + 1) if {n} % i == 0]"]
        return Task(_stub("divisors", [(n, "int")], "list", doc), _indent(body))
    doc = f"Return the number of steps the Collatz sequence takes to reach 1 from {n}."
    body = ["steps = 0", f"while {n} != 1:", f"    if {n} % 2 == 0:", f"        {n} //= 2", "    else:",
            f"        {n} = 3 * {n} + 1", "    steps += 1", "return steps"]
    return Task(_stub("collatz_steps", [(n, "int")], "int", doc), _indent(body))


def _list_task(rng: random.Random) -> Task:
    param = rng.choice(["items", "values", "elements", "data"])
    which = rng.choice(["reverse", "dedupe", "flatten", "chunks", "pairs", "rotate", "last", "running", "zip_sum",
                        "interleave", "count_value", "contains", "sort_desc", "window_sums"])
    if which in ("reverse", "dedupe", "flatten", "chunks", "pairs", "rotate", "last"):
        return _list_shape_task(param, which)
    return _list_scan_task(param, which)


def _list_shape_task(param: str, which: str) -> Task:
    if which == "reverse":
        doc = f"Return a new list with the elements of {param} in reverse order."
        return Task(_stub("reversed_list", [(param, "list")], "list", doc), _indent([f"return {param}[::-1]"]))
    if which == "dedupe":
        doc = f"Return {param} without duplicates, keeping the first occurrence of each."
        body = ["seen = set()", "result = []", f"for item in {param}:", "    if item not in seen:",
                "        seen.add(item)", "        result.append(item)", "return result"]
        return Task(_stub("remove_duplicates", [(param, "list")], "list", doc), _indent(body))
    if which == "flatten":
        doc = f"Flatten {param}, a list of lists, by one level and return the new list."
        body = ["result = []", f"for inner in {param}:", "    result.extend(inner)", "return result"]
        return Task(_stub("flatten", [(param, "list")], "list", doc), _indent(body))
    if which == "chunks":
        doc = f"Split {param} into consecutive lists of at most size elements."
        body = [f"return [{param}[i:i + size] for i in range(0, len({param}), size)]"]
        return Task(_stub("chunks", [(param, "list"), ("size", "int")], "list", doc), _indent(body))
    if which == "pairs":
        doc = f"Return the list of pairs of neighbouring elements of {param}."
        body = [f"return [({param}[i], {param}[i + 1]) for i in range(len({param}) - 1)]"]
        return Task(_stub("neighbour_pairs", [(param, "list")], "list", doc), _indent(body))
    if which == "rotate":
        doc = f"Rotate {param} to the left by steps positions and return the new list."
        body = [f"if not {param}:", "    return []", f"steps %= len({param})", f"return {param}[steps:] + {param}[:steps]"]
        return Task(_stub("rotate_left", [(param, "list"), ("steps", "int")], "list", doc), _indent(body))
    if which == "last":
        doc = f"Return the last element of {param}, or None if it is empty."
        body = [f"if not {param}:", "    return None", f"return {param}[-1]"]
        return Task(_stub("last_element", [(param, "list")], "int", doc), _indent(body))
    raise ValueError(f"not a list-shaping task: {which}")


def _list_scan_task(param: str, which: str) -> Task:
    if which == "running":
        doc = f"Return the list of running totals of {param}."
        body = ["totals = []", "total = 0", f"for value in {param}:", "    total += value", "    totals.append(total)",
                "return totals"]
        return Task(_stub("running_total", [(param, "list")], "list", doc), _indent(body))
    if which == "zip_sum":
        doc = "Return the element-wise sums of two lists of equal length."
        return Task(_stub("add_lists", [("a", "list"), ("b", "list")], "list", doc),
                    _indent(["return [x + y for x, y in zip(a, b)]"]))
    if which == "interleave":
        doc = "Return the elements of first and second alternately, first starting."
        body = ["result = []", "for x, y in zip(first, second):", "    result.append(x)", "    result.append(y)",
                "return result"]
        return Task(_stub("interleave", [("first", "list"), ("second", "list")], "list", doc), _indent(body))
    if which == "count_value":
        doc = f"Return how many times target occurs in {param}."
        body = ["count = 0", f"for item in {param}:", "    if item == target:", "        count += 1", "return count"]
        return Task(_stub("count_occurrences", [(param, "list"), ("target", "int")], "int", doc), _indent(body))
    if which == "contains":
        doc = f"Return True if target is one of the elements of {param}, without using the in operator."
        body = [f"for item in {param}:", "    if item == target:", "        return True", "return False"]
        return Task(_stub("contains", [(param, "list"), ("target", "int")], "bool", doc), _indent(body))
    if which == "sort_desc":
        doc = f"Return the elements of {param} sorted from largest to smallest."
        return Task(_stub("sort_descending", [(param, "list")], "list", doc),
                    _indent([f"return sorted({param}, reverse=True)"]))
    doc = f"Return the sums of each window of size consecutive elements of {param}."
    body = [f"return [sum({param}[i:i + size]) for i in range(len({param}) - size + 1)]"]
    return Task(_stub("window_sums", [(param, "list"), ("size", "int")], "list", doc), _indent(body))


FAMILIES = [(_predicate_task, 4), (_map_task, 2), (_reduce_task, 2), (_dict_task, 2), (_text_task, 2),
            (_number_task, 2), (_list_task, 2)]


def make_task(seed: int, index: int) -> Task:
    rng = random.Random(f"dmtp-program-{seed}-{index}")
    family = rng.choices([f for f, _ in FAMILIES], [w for _, w in FAMILIES])[0]
    return family(rng)


def program_tasks(seed: int, count: int) -> list[Task]:
    return [make_task(seed, i) for i in range(count)]
