"""Numbers quoted in prose, each tied to the generated table it comes from (issue 44, "a ledger tied cell by cell").

A generated table carries an id in its marker (`<!-- table summary: id=t3 from=... -->`); a quoted number names
it in a comment right after the digits, which renders as nothing: `84.47<!--#t3-->` for a table on the same page,
`2.014<!--language_medium#t2-->` for one on another results page (its file name). The audit checks that the
number equals a cell of that table as printed, rounded as quoted (`pages.is_shown`). A number no table holds
(the paper's, a cost, a corpus size) is listed in a `<!-- not from records: ... -->` comment or shown in a
table marked so, and needs no tie.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping

from maskjax import pages

TIE = re.compile(r"<!--(?P<page>[\w.-]*)#(?P<id>[\w-]+)-->")
QUOTE = re.compile(pages.NUMBER.pattern + r"(?P<tie><!--[\w.-]*#[\w-]+-->)?")
_OTHER_COMMENT = re.compile(r"<!--(?![\w.-]*#[\w-]+-->).*?-->", re.S)
_CODE = re.compile(r"`[^`]*`")


def table_ids(text: str) -> dict[str, set[str]]:
    """Each generated table's id and the numbers it shows, each also without its sign: prose says "ahead by
    1.12 points" of a cell -1.12."""
    found = {}
    for match in pages.BLOCK.finditer(text):
        table_id = pages.parse_params(match["params"]).get("id")
        if table_id is not None:
            numbers = pages.table_numbers(match["body"])
            found[table_id] = numbers | {n.lstrip("+-") for n in numbers}
    return found


def hand_numbers(text: str) -> set[str]:
    """Numbers shown by the page's tables that no generator owns (marked not from records): numbers the page
    may quote untied anywhere. A not-from-records comment explains its numbers in its own paragraph only
    (`explained_by_line`), so that a "0.1" explained once does not pass untied all over the page."""
    return pages.table_numbers(pages.BLOCK.sub("", text))


def explained_by_line(text: str) -> dict[int, set[str]]:
    """Line number -> the numbers the not-from-records comments of its paragraph (lines between blank ones)
    list."""
    found: dict[int, set[str]] = {}
    paragraph: list[int] = []
    lines = text.split("\n")
    for number, line in enumerate([*lines, ""], 1):
        if line.strip():
            paragraph.append(number)
            continue
        explained = pages.explained_numbers("\n".join(lines[i - 1] for i in paragraph))
        found.update(dict.fromkeys(paragraph, explained))
        paragraph = []
    return found


def _blank(match: re.Match) -> str:
    """The match as spaces, its line breaks kept, so that lines and columns stay where they were."""
    return re.sub(r"[^\n]", " ", match.group())


def quotes(text: str, cells: bool = False) -> Iterator[tuple[int, str, str | None, int]]:
    """(line number, number, its tie or None, the column after the number) of every decimal number the page
    quotes: in its sentences (not code blocks, code spans, headings, generated tables or other comments) and,
    with cells, in its own tables (a ledger's tables are quotes too). A dash right after a tie is a range's,
    not a sign."""
    kept = _OTHER_COMMENT.sub(_blank, pages.BLOCK.sub(_blank, text))
    fenced = False
    for number, line in enumerate(kept.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        table = line.startswith("|")
        if fenced or line.startswith(("    ", "```", "#")) or (table and not cells):
            continue
        line = pages.ARXIV_ID.sub(lambda m: " " * len(m.group()), _CODE.sub(lambda m: " " * len(m.group()), line))
        for match in QUOTE.finditer(line):
            digits = match.group().split("<!--")[0]
            if digits[0] in "+-" and (digits[0] == "+" or line[: match.start()].endswith("-->")):
                digits = digits[1:]
            yield number, digits, match["tie"], match.start() + len(match.group().split("<!--")[0])


Tables = Mapping[str, Mapping[str, set[str]]]  # page name -> table id -> the numbers it shows


def problems(text: str, page: str, tables: Tables, untied_ok: set[str], cells: bool = False) -> list[str]:
    """What is wrong with the page's quotes: a number tied to no table and not one of `untied_ok` (the numbers
    from no record: `hand_numbers` of a results page; for a ledger, those of every results page and its own
    comments), a tie to a table that does not exist, a number its table does not show."""
    found = []
    explained = explained_by_line(text)
    for line, number, tied, _ in quotes(text, cells):
        tie = TIE.fullmatch(tied) if tied else None
        if tie is None:
            if not pages.is_shown(number, untied_ok | explained.get(line, set())):
                found.append(f"line {line}: {number} names no table")
            continue
        where = tie["page"] or page
        shown = tables.get(where, {}).get(tie["id"])
        if shown is None:
            found.append(f"line {line}: {number} names table {where}#{tie['id']}, which does not exist")
        elif not pages.is_shown(number, shown):
            found.append(f"line {line}: {number} is not in table {where}#{tie['id']}")
    return found


def with_ids(text: str) -> str:
    """The page with an id on every generated table that has none (t1, t2, ... after the highest taken)."""
    taken = set(table_ids(text))
    counter = iter(n for n in range(1, 10_000) if f"t{n}" not in taken)

    def name(match: re.Match) -> str:
        if "id" in pages.parse_params(match["params"]):
            return match.group()
        marker = f"<!-- table {match['kind']}:"
        return match.group().replace(marker, f"{marker} id=t{next(counter)}", 1)

    return pages.BLOCK.sub(name, text)


LINK = re.compile(r"(?:results/|\(|`)([\w-]+)\.md\b")


PLUS_MINUS = re.compile(r"\s*\+-\s*(" + pages.NUMBER.pattern + ")")


def tie(text: str, page: str, tables: Tables, untied_ok: set[str], cells: bool = False) -> str:
    """The page with a tie after every quoted number that has none, is not one of `untied_ok` and that a
    generated table shows: the table the line's previous quote was tied to, else the first on the page itself,
    else on a results page the line names (a link or `page.md`); a mean quoted with its spread (`A +- B`) goes
    to a table that shows both. Other numbers are left for `problems` to name: a page no line names is never
    guessed, since short numbers match cells of unrelated tables by their digits alone. The choice is by
    digits: a reader checks that the table it names is the number's source."""
    lines = text.split("\n")
    inserts: dict[int, list[tuple[int, str]]] = {}
    previous: dict[int, tuple[str, str]] = {}
    explained = explained_by_line(text)
    for line, number, tied, end in quotes(text, cells):
        if tied or pages.is_shown(number, untied_ok | explained.get(line, set())):
            continue
        spread = PLUS_MINUS.match(lines[line - 1], end)
        wanted = [number, *([spread.group(1)] if spread else [])]
        order = dict.fromkeys([page, *LINK.findall(lines[line - 1])])
        found = [previous[line]] if line in previous else []
        found += [(p, i) for p in order for i in tables.get(p, {})]
        target = next(
            ((p, i) for p, i in found if all(pages.is_shown(n, tables[p][i]) for n in wanted)),
            next(((p, i) for p, i in found if pages.is_shown(number, tables[p][i])), None),
        )
        if target is not None:
            previous[line] = target
            label = "" if target[0] == page else target[0]
            inserts.setdefault(line - 1, []).append((end, f"<!--{label}#{target[1]}-->"))
    for index, places in inserts.items():
        for end, text_tie in sorted(places, reverse=True):
            lines[index] = lines[index][:end] + text_tie + lines[index][end:]
    return "\n".join(lines)


def site_tables(texts: Mapping[str, str]) -> dict[str, dict[str, set[str]]]:
    """Every page's tables by id, keyed by the page's name (its file name without .md)."""
    return {name: table_ids(text) for name, text in texts.items()}


def ledger_untied(ledger: str, results: Iterable[str]) -> set[str]:
    """The numbers a ledger may quote untied: its own not-from-records comments' and those every results page
    shows from no record (the paper's numbers, costs)."""
    return pages.explained_numbers(ledger).union(
        *(hand_numbers(text) | pages.explained_numbers(text) for text in results)
    )
