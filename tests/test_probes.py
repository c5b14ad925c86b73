import math

from maskjax import store


def test_probes_cli_tabulates_first_and_last_probe(cli, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    record = {"task": "2parity", "method": "mask", "open_value": 10.0, "closed_value": -10.0, "seed": 0}
    records = [
        {
            **record,
            "attention_drift": [[0.0, 0.0], [0.02, 0.5]],
            "attention_drift_unseen": [[0.0, 0.0], [0.01, 0.4]],
            "prior_logit_drift": [[0.0, 0.0], [0.07, 0.07]],
            "mask_change_open_mean": [[0.0, 0.0], [0.08, 0.08]],
            "optimizer": "sgd",
            "mask_weight_decay": 0.0,
            "grad_norm_mask": [[2e-5, 4e-5], [1e-5, 3e-5]],
            "grad_norm_qk": [[0.2, 0.4], [0.1, 0.3]],
        },
        {
            "task": "2parity",
            "method": "qk_svd",
            "seed": 0,
            "attention_drift": [[0.0], [0.1]],
            "prior_logit_drift": [[0.0], [0.4]],
            "grad_norm_mask": [[0.0], [0.0]],
            "grad_norm_qk": [[1.0], [2.0]],
        },
        {
            "task": "2parity",
            "method": "vanilla",
            "seed": 0,
            "attention_drift": [[0.0], [0.3]],
            "prior_logit_drift": [[0.0], [0.2]],
        },
        {"task": "2parity", "method": "mdi"},
    ]
    store.write_jsonl(run / "results.jsonl", records)
    result = cli("experiments.probes", str(run))
    assert result.returncode == 0, result.stderr
    text = (run / "probes.md").read_text()
    sigmoid = 1 / (1 + math.exp(10))
    row = "| 2parity | mask | - | 10.0 | -10.0 | sgd | 0.0 | 1 | 0 | - | 0.02 | - | 0.01 | 0.07 | 0.08 | - |"
    assert f"{row} 3e-05 | 2e-05 | 0.3 | 0.2 | 0.0001 | {sigmoid:.4g} |" in text
    assert "| 2parity | qk_svd | - | - | - | adam | - | 1 | 0 | - | 0.1 | - | - | 0.4 | - | - | 0 | 0 | 1 | 2 |" in text
    assert "| 2parity | vanilla | - | - | - | adam | - | 1 | 0 | - | 0.3 | - | - | 0.2 | - | - | - | - |" in text
    assert "| mdi |" not in text, "a record without probes (the MDI's) got a row"


def test_probes_cli_refuses_a_folder_without_results(main, tmp_path):
    result = main("experiments.probes", str(tmp_path))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "results.jsonl" in lines[0], result.stderr
