import re

from conftest import ROOT


def test_every_snippet_of_the_embedding_page_runs_top_to_bottom():
    page = (ROOT / "docs" / "embedding.md").read_text()
    snippets = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert len(snippets) >= 5
    namespace: dict = {"__name__": "embedding_doc"}
    for snippet in snippets:
        exec(compile(snippet, "docs/embedding.md", "exec"), namespace)
    assert namespace["loss"].shape == () and namespace["grads"] is not None
    # issue 31: the layout, relative-mask, jit-decoding, params-only and nn.scan snippets are on the page
    for name in ("biased_BTNS", "half", "decode_step", "nnx_step", "moved", "y_scanned", "host_params"):
        assert name in namespace, name
