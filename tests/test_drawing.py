import os
import subprocess
import sys
import time

import numpy as np
import pytest

from maskjax import drawing, files, plots

STEPS = [0, 10, 20]
RECORDS = [
    {"method": m, "drift_steps": STEPS, "attention_drift": [[0.1 * s * (i + 1)] * 2 for s in range(3)]}
    for i, m in enumerate(("vanilla", "mask"))
]
MATRICES = {"prior": np.eye(4), "trained": np.full((4, 4), 0.25)}


def draw_all(out):
    plots.plot_drift(RECORDS, out / "drift.png", ["attention_drift"])
    plots.plot_matrices(MATRICES, out / "maps.png", ["a", "b", "c", "d"])
    plots.plot_loss([{"method": "mask", "train_loss_steps": STEPS, "train_loss_curve": [3, 2, 1]}], out / "loss.png")


@pytest.fixture
def children():
    drawing.start(2)
    yield drawing._children
    drawing.stop()


def test_children_draw_a_batch_byte_for_byte_as_the_parent_does(tmp_path, children, monkeypatch):
    (tmp_path / "here").mkdir()
    (tmp_path / "there").mkdir()
    with monkeypatch.context() as patched:
        patched.setattr(drawing, "_children", [])  # no children: drawn in place
        draw_all(tmp_path / "here")

    def in_the_parent(fig, path):
        raise AssertionError(f"{path} was drawn in the parent")

    monkeypatch.setattr(plots, "save_figure", in_the_parent)
    with drawing.batch():
        draw_all(tmp_path / "there")
        assert not list((tmp_path / "there").iterdir())  # queued until the batch ends
    for name in ("drift.png", "maps.png", "loss.png"):
        assert (tmp_path / "there" / name).read_bytes() == (tmp_path / "here" / name).read_bytes()
    assert len(children) == 2


def test_a_figure_a_child_fails_on_raises_in_the_parent_with_its_own_error(tmp_path, children):
    with pytest.raises(KeyError, match="acc_all"), drawing.batch():
        plots.plot_drift(RECORDS, tmp_path / "drift.png", ["attention_drift"])
        plots.plot_accuracy([{"task": "t", "method": "m"}], tmp_path / "acc.png")
    assert (tmp_path / "drift.png").is_file()  # the batch's other figures are drawn
    assert len(children) == 2  # a failing figure does not cost a child


def test_figures_of_a_child_that_died_are_drawn_in_the_parent(tmp_path, children):
    for child in children:
        child.process.kill()
        child.process.wait()
    with drawing.batch():
        draw_all(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drift.png", "loss.png", "maps.png"]
    assert children == []


def test_what_a_child_writes_to_stdout_does_not_reach_its_answers(tmp_path, children, monkeypatch):
    """fd 1 of a child is its stderr: a library writing there (here os.write, as C code would) cannot
    corrupt the answers; nor does a job that does not pickle stop the batch (the parent draws it)."""

    def in_the_parent(fig, path):
        raise AssertionError(f"{path} was drawn in the parent")

    def local(path):  # a local function does not pickle
        path.write_text("drawn here")

    monkeypatch.setattr(plots, "save_figure", in_the_parent)
    with drawing.batch():
        for _ in range(2):
            drawing._queue.append((os.write, (1, b"\x07" * 4096), {}))
        drawing._queue.append((local, (tmp_path / "local.txt",), {}))
        plots.plot_drift(RECORDS, tmp_path / "drift.png", ["attention_drift"])
    assert (tmp_path / "drift.png").is_file() and (tmp_path / "local.txt").read_text() == "drawn here"
    assert len(children) == 2


def test_a_child_that_hangs_is_ended_and_its_job_handed_back_to_the_parent(children, monkeypatch):
    monkeypatch.setattr(drawing, "STALL_SECONDS", 0.5)
    hang = (time.sleep, (60,), {})
    started = time.monotonic()
    assert drawing._draw_on_children([hang]) == [hang]
    assert time.monotonic() - started < 30
    assert len(children) == 1


def test_an_interrupted_batch_ends_the_busy_children(tmp_path, children, monkeypatch):
    """Their answers would otherwise be read as answers to a later batch's jobs."""

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(drawing.select, "select", interrupted)
    with pytest.raises(KeyboardInterrupt), drawing.batch():
        draw_all(tmp_path)
    assert children == []


def test_without_matplotlib_no_child_starts(monkeypatch):
    real = drawing.importlib.util.find_spec
    monkeypatch.setattr(drawing.importlib.util, "find_spec", lambda name: None if name == "matplotlib" else real(name))
    drawing.start(2)
    assert drawing._children == []


def test_the_terminals_ctrl_c_reaches_the_parent_only(children):
    """The children run in sessions of their own, so Ctrl-C is the parent's to report, with no child's
    traceback beside it."""
    assert all(os.getpgid(c.process.pid) != os.getpgrp() for c in children)


def test_a_child_outliving_its_parent_exits():
    child = drawing._Child()
    child.process.stdin.close()  # what the parent's death does to the pipe
    assert child.process.wait(timeout=60) == 0
    child.process.stdout.close()


def test_a_batch_that_raises_draws_nothing(tmp_path, children):
    with pytest.raises(RuntimeError, match="stop"), drawing.batch():
        draw_all(tmp_path)
        raise RuntimeError("stop")
    assert not list(tmp_path.iterdir())


def test_the_figure_code_imports_no_jax_but_the_package_names_still_resolve():
    code = (
        "import sys, maskjax, maskjax.plots, maskjax.drawing; assert 'jax' not in sys.modules, 'jax'; "
        "assert maskjax.attention.mask_shape('full', 2, 3) == (2, 3, 3); assert maskjax.mask_bias; "
        "assert 'jax' in sys.modules; assert sorted(dir(maskjax)) == sorted(set(dir(maskjax)))"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    import maskjax

    with pytest.raises(AttributeError, match="no attribute 'mask_bais'"):
        maskjax.mask_bais  # noqa: B018


def test_replacing_keeps_the_old_file_when_the_writer_fails(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("old")
    with pytest.raises(ValueError), files.replacing(path) as tmp:
        open(tmp, "w").write("torn")
        raise ValueError
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]
    files.write_bytes(path, b"new")
    assert path.read_bytes() == b"new"
