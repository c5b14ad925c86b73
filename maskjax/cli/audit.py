"""Check every results page against its records: python -m experiments.audit [PAGE ...] [--write]

Each generated table (`maskjax.pages`) is rebuilt from the results.jsonl it names and compared with the
page character by character; any other table must say on the line above why it is not from records
(`<!-- not from records: the paper's numbers -->`); and a page's text may quote only decimal numbers
that a table shows (its own, or another page's generated tables, rounded to the quote's decimals).
Exit 0 when every page agrees, 1 with a diff of each that does not; `--write` rewrites the generated
tables instead (atomically), and never touches prose. Run without pages, it also checks the ledger
(docs/claims.md) and README: every decimal number they quote must be on a results page, README's results
table must be the ledger's "At a glance" table, and each effect the ledger names must come from records
(`--write` copies the table into README and draws the effects, docs/claims.png).
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Iterable
from pathlib import Path

from maskjax import pages, plots, store
from maskjax.cli import scale
from maskjax.cli.driver import Parser, UserError, run_main

KINDS = {**pages.KINDS, **scale.PAGE_KINDS}

# The checkout this code runs from; from an install, the folder the command runs in.
CHECKOUT = Path(__file__).resolve().parents[2]
ROOT = CHECKOUT if (CHECKOUT / "docs" / "results").is_dir() else Path.cwd()
RESULTS = ROOT / "docs" / "results"
LEDGERS = (ROOT / "docs" / "claims.md", ROOT / "README.md")
EFFECTS_FIGURE = ROOT / "docs" / "claims.png"


def audit_page(path: Path, text: str, elsewhere: set[str], write: bool) -> list[str]:
    """The problems of one page (empty when it agrees with its records)."""
    fresh = pages.refresh(text, path.parent, KINDS)
    problems = []
    if fresh != text:
        if write:
            store.write_atomic(path, fresh)
        else:
            diff = difflib.unified_diff(
                text.splitlines(), fresh.splitlines(), f"{path} (page)", f"{path} (from its records)", lineterm="", n=1
            )
            problems.append("generated tables differ from their records:\n" + "\n".join(list(diff)[:60]))
    unexplained = pages.unexplained_tables(fresh)
    if unexplained:
        lines = ", ".join(map(str, unexplained))
        problems.append(f"tables at line {lines} are neither generated nor marked <!-- not from records: why -->")
    unshown = pages.unshown_quotes(fresh, elsewhere)
    if unshown:
        problems.append(f"quotes numbers no table shows: {', '.join(dict.fromkeys(unshown))}")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m experiments.audit", description=__doc__.splitlines()[0])
    p.add_argument("pages", nargs="*", type=Path, help=f"markdown pages (default: every page in {RESULTS})")
    p.add_argument("--write", action="store_true", help="rewrite the generated tables from their records")
    args = p.parse_args(argv)
    paths = args.pages or sorted(RESULTS.glob("*.md"))
    for path in paths:
        if not path.is_file():
            raise UserError(f"{path} is not a page")
    texts = {path.resolve(): path.read_text() for path in [*sorted(RESULTS.glob("*.md")), *paths]}
    every = {path: pages.generated_numbers(text) for path, text in texts.items()}
    failed = 0
    for path in paths:
        text = texts[path.resolve()]
        elsewhere = set().union(*(numbers for other, numbers in every.items() if other != path.resolve()))
        problems = audit_page(path, text, elsewhere, args.write)
        tables = pages.tables_in(text)
        if problems:
            failed += 1
            print(f"FAIL {path}: " + "\n".join(problems))
        else:
            print(f"ok   {path}: {tables} generated table{'s' if tables != 1 else ''}")
    if not args.pages:
        failed += audit_ledgers(texts.values(), args.write)
    if failed:
        print(f"{failed} pages disagree with their records", file=sys.stderr)
        return 1
    return 0


def audit_ledgers(texts: Iterable[str], write: bool = False) -> int:
    """claims.md and README quote the results pages (`texts`): each decimal number they quote, in text or in
    their own tables, must be one a results page's table shows (or explains as not from records); README's
    glance table must be the ledger's, and every effect the ledger names must come from its records. With
    write, README's glance table is rewritten and the effects figure (docs/claims.png) drawn."""
    shown = set().union(*(pages.table_numbers(t) | pages.explained_numbers(t) for t in texts))
    failed = audit_glance(write)
    for path in LEDGERS:
        unshown = [n for n in pages.ledger_numbers(path.read_text()) if not pages.is_shown(n, shown)]
        if unshown:
            failed += 1
            print(f"FAIL {path}: quotes numbers no results page shows: {', '.join(dict.fromkeys(unshown))}")
        else:
            print(f"ok   {path}: every quoted number is on a results page")
    return failed


def audit_glance(write: bool) -> int:
    """README's glance table against the ledger's, and the ledger's effects against their records."""
    ledger, readme_path = LEDGERS[0].read_text(), LEDGERS[1]
    readme = readme_path.read_text()
    fresh = pages.with_glance(readme, ledger)
    effects = pages.ledger_effects(ledger, RESULTS)
    if write:
        if fresh != readme:
            store.write_atomic(readme_path, fresh)
        plots.plot_effects(effects, EFFECTS_FIGURE)
    elif fresh != readme:
        print(f"FAIL {readme_path}: its glance table differs from {LEDGERS[0]}'s (run with --write)")
        return 1
    print(f"ok   {readme_path}: the glance table is the ledger's; {len(effects)} effects from their records")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
