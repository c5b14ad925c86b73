"""Two real processes on one job (README, "Many hosts"): the runs sharded over both, files from process 0."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
from conftest import ROOT, run_cli

ARGS = ["--preset=test", "--seeds=4", "--tasks=2parity", "--methods=mask", "--cpu-devices=1"]
FLOATS = ("acc_all", "acc_unseen", "mse", "unseen_mean_prediction", "train_loss", "pair_coefficient")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_train_one_sweep_and_only_process_zero_writes(tmp_path):
    port = free_port()
    processes = []
    for index in range(2):
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "MASKJAX_DISTRIBUTED": "1",
            "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
            "JAX_NUM_PROCESSES": "2",
            "JAX_PROCESS_ID": str(index),
        }
        command = [sys.executable, "-m", "experiments.boolean", *ARGS, f"--out={tmp_path / f'process{index}'}"]
        processes.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outputs = [p.communicate(timeout=600) for p in processes]
    for p, (_, err) in zip(processes, outputs, strict=True):
        assert p.returncode == 0, err.decode()[-3000:]
    assert "on 2 device(s)" in outputs[0][1].decode()  # one device per process, one mesh over both
    assert not (tmp_path / "process1").exists()  # process 1 trained, wrote nothing
    single = run_cli("experiments.boolean", *ARGS, f"--out={tmp_path / 'single'}")
    assert single.returncode == 0, single.stderr
    read = [
        {r["seed"]: r for r in map(json.loads, (tmp_path / name / "results.jsonl").read_text().splitlines())}
        for name in ("process0", "single")
    ]
    assert sorted(read[0]) == sorted(read[1]) == [0, 1, 2, 3]
    for seed, record in read[0].items():
        assert len(record["devices"]) == 2
        for key in FLOATS:  # two devices against one: the same runs to float rounding
            np.testing.assert_allclose(record[key], read[1][seed][key], rtol=1e-5, atol=1e-7)
