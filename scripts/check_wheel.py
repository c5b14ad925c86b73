"""What an embedding user gets from `pip install maskjax`, checked: python scripts/check_wheel.py [--minimum]

Builds the sdist and the wheel (`python -m build`), installs the wheel with no extras into a fresh
virtualenv, and checks that
- only `maskjax` lands in site-packages (no top-level `experiments` or `benchmarks`),
- the installed distributions are maskjax, jax, flax, optax, numpy and what those four require, nothing
  else (pip and setuptools aside),
- the core tests and the docs/embedding.md snippets pass against that install (not the checkout).
With --minimum the four are pinned to the lower bounds pyproject.toml names, so those bounds are
versions that were run. Exit 0 when all hold; anything else exits non-zero with what differed.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ("jax", "flax", "optax", "numpy")
# The tests that need nothing beyond the core and the test tools (tests/test_embedding_doc.py runs the
# snippets of docs/embedding.md).
CORE_TESTS = (
    "test_attention.py",
    "test_bias.py",
    "test_bias_structure.py",
    "test_embedding_doc.py",
    "test_properties.py",
)
TEST_TOOLS = ("pytest", "chex", "hypothesis")
# Collects the installed distributions and the closure of maskjax's requirements, inside the new virtualenv:
# maskjax with no extras, and each dependency with the extras its dependents ask of it (etils[epath]).
CLOSURE = r"""
import json, re
from importlib import metadata
from packaging.requirements import Requirement

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

installed = {norm(d.metadata["Name"]) for d in metadata.distributions()}
needed, seen, todo = set(), set(), [("maskjax", ())]
while todo:
    name, extras = todo.pop()
    if (name, extras) in seen:
        continue
    seen.add((name, extras))
    needed.add(name)
    for text in metadata.requires(name) or []:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ("", *extras)):
            todo.append((norm(req.name), tuple(sorted(req.extras))))
print(json.dumps({"installed": sorted(installed), "needed": sorted(needed)}))
"""


def run(*command: str | Path, cwd: Path | None = None) -> str:
    print("+", " ".join(map(str, command)), flush=True)
    done = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(
            f"failed ({done.returncode}): {' '.join(map(str, command))}\n{done.stdout[-4000:]}{done.stderr[-4000:]}"
        )
    return done.stdout


def minimum_pins() -> list[str]:
    """`name==lower bound` for each core dependency, read from pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = []
    for requirement in project["dependencies"]:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9][^,;\s]*)", requirement.strip())
        if match is None:
            sys.exit(f"pyproject.toml: {requirement!r} has no plain lower bound to test")
        pins.append(f"{match[1]}=={match[2]}")
    return pins


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minimum", action="store_true", help="pin jax, flax, optax, numpy to their lower bounds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="maskjax-wheel-") as folder:
        return check(Path(folder), args.minimum)


def check(work: Path, minimum: bool) -> int:
    """Build, install and test in `work` (a folder removed afterwards)."""
    run(sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", work / "dist", ROOT)
    (wheel,) = (work / "dist").glob("maskjax-*.whl")
    venv = work / "venv"
    run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    pins = minimum_pins() if minimum else []
    run(python, "-m", "pip", "install", "-q", wheel, *pins)

    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    problems = [
        f"a top-level {name!r} was installed" for name in ("experiments", "benchmarks") if (site / name).exists()
    ]
    (info,) = site.glob("maskjax-*.dist-info")
    paths = [line.rsplit(",", 2)[0] for line in (info / "RECORD").read_text().splitlines() if line]
    roots = {path.split("/")[0] for path in paths if not path.startswith("..")}  # ../../bin/maskjax: the script
    if roots != {"maskjax", info.name}:
        problems.append(f"the wheel installs more than maskjax: {sorted(roots)}")
    run(python, "-m", "pip", "install", "-q", "packaging")
    sets = json.loads(run(python, "-c", CLOSURE))
    extra = set(sets["installed"]) - set(sets["needed"]) - {"pip", "setuptools", "packaging"}
    missing = {"maskjax", *CORE} - set(sets["needed"])
    if extra:
        problems.append(f"installed beyond the four and their dependencies: {sorted(extra)}")
    if missing:
        problems.append(f"the core dependencies are not {sorted(CORE)}: missing {sorted(missing)}")
    versions = run(python, "-c", f"import {', '.join(CORE)}; print({', '.join(f'{n}.__version__' for n in CORE)})")
    versions = versions.split()
    print("installed: " + ", ".join(f"{n} {v}" for n, v in zip(CORE, versions, strict=True)))

    run(python, "-m", "pip", "install", "-q", *TEST_TOOLS)
    where = run(python, "-c", "import maskjax; print(maskjax.__file__)", cwd=work).strip()
    if not where.startswith(str(site)):
        problems.append(f"the tests would import maskjax from {where}, not the installed wheel")
    # pytest from the wheel's virtualenv, outside the checkout: maskjax comes from site-packages.
    tests = [ROOT / "tests" / name for name in CORE_TESTS]
    output = run(venv / "bin" / "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *tests, cwd=work)
    print(output.strip().splitlines()[-1])
    if problems:
        print("\n".join(f"FAIL {p}" for p in problems), file=sys.stderr)
        return 1
    print(f"ok: {wheel.name} installs maskjax alone, needs only {', '.join(CORE)}, and its core tests pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
