import os

import nbformat
import numpy as np
from conftest import ROOT
from nbclient import NotebookClient
from test_vision import write_idx


def execute(name: str, folder, monkeypatch, **env: str) -> str:
    """Run notebooks/NAME top to bottom in `folder` at the test preset; every code cell's text output."""
    monkeypatch.setenv("MASKJAX_NOTEBOOK_PRESET", "test")
    monkeypatch.setenv("MASKJAX_NOTEBOOK_SEEDS", "2")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    notebook = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    resources = {"metadata": {"path": str(folder)}}
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources=resources).execute()
    return "\n".join(
        "".join(o.get("text", "") + str(o.get("data", {}).get("text/markdown", "")) for o in cell.get("outputs", []))
        for cell in notebook.cells
        if cell.cell_type == "code"
    )


def is_png(path) -> bool:
    return path.read_bytes()[:4] == b"\x89PNG"


def test_colab_notebook_runs_top_to_bottom_at_the_test_preset(tmp_path, monkeypatch):
    text = execute("boolean_colab.ipynb", tmp_path, monkeypatch)
    assert "backend: cpu" in text
    assert "8 runs done" in text
    assert "| 2parity | mdi | - | - | 75.00 |" in text and "| 2parity | mask | 2 | 0 |" in text
    assert "pure function: (3, 8, 2, 4)" in text and "linen: (3, 1)" in text and "nnx: (3, 8, 16)" in text
    assert "flax attention + mask: (3, 8, 16) mask parameter (2, 8, 8)" in text
    figures = tmp_path / "maskjax_figures"
    assert is_png(figures / "accuracy.png") and is_png(figures / "attention.png")


def test_vision_notebook_runs_the_study_through_the_cli_path(tmp_path, monkeypatch):
    data = tmp_path / "fashion"
    data.mkdir()
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 40), ("t10k", 16)):
        write_idx(data / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        write_idx(data / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    text = execute("vision_colab.ipynb", tmp_path, monkeypatch, MASKJAX_NOTEBOOK_DATA_DIR=str(data))
    assert "40 training and 16 test images" in text and "8 runs done" in text
    assert "| fashion_mnist | 1.0 | mask | 2 |" in text
    out = tmp_path / "results" / "vision_notebook"
    assert len((out / "results.jsonl").read_text().splitlines()) == 8 and (out / "config.json").exists()
    assert is_png(out / "curves_fashion_mnist_1.png") and "curves_fashion_mnist_1.png" in text


def test_language_notebook_runs_the_study_through_the_cli_path(tmp_path, monkeypatch):
    words = "the cat sat on the mat and a dog ran to the park while birds sang".split()
    rng = np.random.default_rng(0)
    stories = tmp_path / "stories.txt"
    stories.write_text("\n<|endoftext|>\n".join(" ".join(rng.choice(words, 30)) for _ in range(30)))
    text = execute("language_colab.ipynb", tmp_path, monkeypatch, MASKJAX_NOTEBOOK_TEXT=str(stories))
    assert "corpus: text" in text and "6 runs done" in text and "| text | alibi | 2 |" in text
    out = tmp_path / "results" / "language_notebook"
    assert len((out / "results.jsonl").read_text().splitlines()) == 6 and is_png(out / "bias_mask.png")


def test_embedding_notebook_adds_a_mask_to_a_trained_model_and_fine_tunes_it(tmp_path, monkeypatch):
    text = execute("embedding_colab.ipynb", tmp_path, monkeypatch, MASKJAX_NOTEBOOK_STEPS="40")
    assert "pretrained: loss" in text and "with the prior, before fine-tuning: accuracy" in text
    assert "fine-tuned: loss" in text
    change = float(text.split("largest change of a mask logit:")[1].split()[0])
    assert change > 0  # the mask is a trained parameter: fine-tuning moves it
    assert is_png(tmp_path / "maskjax_figures" / "mask_before_after.png")
