"""Check every results page against its records: python -m experiments.audit [PAGE ...] [--write]

Each generated table (`maskjax.pages`) is rebuilt from the results.jsonl it names and compared with the
page character by character; any other table must say on the line above why it is not from records
(`<!-- not from records: the paper's numbers -->`); and every decimal number a page's text quotes names the
generated table it comes from (`maskjax.quotes`: `84.47<!--#t3-->`, or `<!--PAGE#t3-->` on another page) and
equals a cell of it as printed, rounded as quoted, unless the page shows it from no record.
Exit 0 when every page agrees, 1 with a diff of each that does not; `--write` rewrites the generated
tables instead (atomically), gives each an id, and ties each untied quote to the first table that shows
it (on the page, else on a page its line links to, else any); it changes no other prose. Run without
pages, it also checks the ledger (docs/claims.md) and README: every decimal number they quote, in text or
tables, is tied to a results page's table or shown there from no record; README's results table is the
ledger's "At a glance" table, and each effect the ledger names comes from records (`--write` ties the
quotes, copies the table into README and draws the effects, docs/claims.png).
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

from maskjax import pages, plots, quotes, store
from maskjax.cli import scale
from maskjax.cli.driver import Parser, UserError, run_main

KINDS = {**pages.KINDS, **scale.PAGE_KINDS}

# The checkout this code runs from; from an install, the folder the command runs in.
CHECKOUT = Path(__file__).resolve().parents[2]
ROOT = CHECKOUT if (CHECKOUT / "docs" / "results").is_dir() else Path.cwd()
RESULTS = ROOT / "docs" / "results"
LEDGERS = (ROOT / "docs" / "claims.md", ROOT / "README.md")
EFFECTS_FIGURE = ROOT / "docs" / "claims.png"


def fresh_page(path: Path, text: str) -> str:
    """The page with an id on every generated table and every table rebuilt from its records."""
    return pages.refresh(quotes.with_ids(text), path.parent, KINDS)


def audit_page(path: Path, text: str, fresh: str, site: quotes.Tables, write: bool) -> list[str]:
    """The problems of one page (empty when it agrees with its records). With write, the page is rewritten from
    its records and its untied quotes tied (`quotes.tie`) first."""
    if write:
        fresh = quotes.tie(fresh, path.stem, site, quotes.hand_numbers(fresh))
        if fresh != text:
            store.write_atomic(path, fresh)
        text = fresh
    problems = []
    if fresh != text:
        diff = difflib.unified_diff(
            text.splitlines(), fresh.splitlines(), f"{path} (page)", f"{path} (from its records)", lineterm="", n=1
        )
        problems.append("generated tables differ from their records:\n" + "\n".join(list(diff)[:60]))
    unexplained = pages.unexplained_tables(fresh)
    if unexplained:
        lines = ", ".join(map(str, unexplained))
        problems.append(f"tables at line {lines} are neither generated nor marked <!-- not from records: why -->")
    wrong = quotes.problems(text, path.stem, site, quotes.hand_numbers(text))
    if wrong:
        problems.append("quotes that disagree with the tables they name:\n  " + "\n  ".join(wrong))
    return problems


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m experiments.audit", description=__doc__.splitlines()[0])
    p.add_argument("pages", nargs="*", type=Path, help=f"markdown pages (default: every page in {RESULTS})")
    p.add_argument(
        "--write", action="store_true", help="rewrite the generated tables from their records and tie untied quotes"
    )
    args = p.parse_args(argv)
    paths = args.pages or sorted(RESULTS.glob("*.md"))
    for path in paths:
        if not path.is_file():
            raise UserError(f"{path} is not a page")
    texts = {path.resolve(): path.read_text() for path in [*sorted(RESULTS.glob("*.md")), *paths]}
    fresh = {path: fresh_page(path, text) for path, text in texts.items()}
    site = quotes.site_tables({path.stem: text for path, text in fresh.items()})
    failed = 0
    for path in paths:
        text = texts[path.resolve()]
        problems = audit_page(path, text, fresh[path.resolve()], site, args.write)
        tables = pages.tables_in(text)
        if problems:
            failed += 1
            print(f"FAIL {path}: " + "\n".join(problems))
        else:
            print(f"ok   {path}: {tables} generated table{'s' if tables != 1 else ''}")
    if not args.pages:
        results = [text for path, text in fresh.items() if path.parent == RESULTS.resolve()]
        failed += audit_ledgers(results, site, args.write)
    if failed:
        print(f"{failed} pages disagree with their records", file=sys.stderr)
        return 1
    return 0


def audit_ledgers(results: list[str], site: quotes.Tables, write: bool = False) -> int:
    """claims.md and README quote the results pages (`results`, their texts): each decimal number they quote, in
    text or in their own tables, must be tied to a results page's table that shows it, or be one the pages show
    from no record (the paper's numbers); README's glance table must be the ledger's, and every effect the
    ledger names must come from its records. With write, the ledger is tied first, then README's glance table
    copied from it, the effects figure (docs/claims.png) drawn and README's other quotes tied."""
    claims, readme = LEDGERS
    return audit_ledger(claims, results, site, write) + audit_glance(write) + audit_ledger(readme, results, site, write)


def audit_ledger(path: Path, results: list[str], site: quotes.Tables, write: bool) -> int:
    text = path.read_text()
    untied_ok = quotes.ledger_untied(text, results)
    if write:
        tied = quotes.tie(text, path.stem, site, untied_ok, cells=True)
        if tied != text:
            store.write_atomic(path, tied)
            text = tied
    wrong = quotes.problems(text, path.stem, site, untied_ok, cells=True)
    if wrong:
        print(f"FAIL {path}: quotes that disagree with the tables they name:\n  " + "\n  ".join(wrong))
        return 1
    print(f"ok   {path}: every quoted number is tied to a results page's table, or from no record")
    return 0


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
