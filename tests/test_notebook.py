import os

import nbformat
from conftest import ROOT
from nbclient import NotebookClient


def test_colab_notebook_runs_top_to_bottom_at_the_test_preset(tmp_path, monkeypatch):
    monkeypatch.setenv("MASKJAX_NOTEBOOK_PRESET", "test")
    monkeypatch.setenv("MASKJAX_NOTEBOOK_SEEDS", "2")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    notebook = nbformat.read(ROOT / "notebooks" / "boolean_colab.ipynb", as_version=4)
    resources = {"metadata": {"path": str(tmp_path)}}
    client = NotebookClient(notebook, timeout=600, kernel_name="python3", resources=resources)
    client.execute()
    outputs = {
        i: "".join(o.get("text", "") + str(o.get("data", {}).get("text/markdown", "")) for o in cell.get("outputs", []))
        for i, cell in enumerate(notebook.cells)
        if cell.cell_type == "code"
    }
    text = "\n".join(outputs.values())
    assert "backend: cpu" in text
    assert "8 runs done" in text
    assert "| 2parity | mdi | - | - | 75.00 |" in text and "| 2parity | mask | 2 | 0 |" in text
    assert "pure function: (3, 8, 2, 4)" in text and "linen: (3, 1)" in text and "nnx: (3, 8, 16)" in text
    assert "flax attention + mask: (3, 8, 16) mask parameter (2, 8, 8)" in text
    assert (tmp_path / "maskjax_figures" / "accuracy.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "maskjax_figures" / "attention.png").read_bytes()[:4] == b"\x89PNG"
