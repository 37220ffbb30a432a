"""bench/torch_peers.py without a GPU or PyTorch: the 2:4 mask and the int4 packing it gives
PyTorch, tinygemm's reference, and the ncu path (command, log read back by subject, result
file). The PyTorch calls themselves run only on the GPU machine."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import torch_peers  # noqa: E402


def test_mask_keeps_the_two_largest_of_every_four_ties_to_the_lower_index() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 64)).astype(np.float16)
    w[0, :4] = [1, -1, 1, 0.5]  # a tie: the first two of the three largest
    keep = torch_peers.mask_2of4(w)
    assert (keep.reshape(6, 16, 4).sum(-1) == 2).all()
    assert keep[0, :4].tolist() == [True, True, False, False]
    mags = np.abs(w.astype(np.float64)).reshape(6, 16, 4)
    kept_min = np.where(keep.reshape(6, 16, 4), mags, np.inf).min(-1)
    dropped_max = np.where(keep.reshape(6, 16, 4), -np.inf, mags).max(-1)
    assert (kept_min >= dropped_max).all()


def test_int4_pairs_put_the_even_index_in_the_high_nibble() -> None:
    codes = np.array([[1, 2, 15, 0], [7, 8, 3, 12]], np.uint8)
    assert torch_peers.pack_int4_pairs(codes).tolist() == [[0x12, 0xF0], [0x78, 0x3C]]


def test_tinygemm_reference_is_q_minus_8_times_scale_plus_zero() -> None:
    k = 2 * torch_peers.TINYGEMM_GROUP
    codes = np.zeros((2, k), np.uint8)
    codes[0, 0], codes[1, k - 1] = 15, 3
    scales = np.array([[0.5, 2.0], [0.25, 1.0]])  # [K/128, N]
    zeros = np.array([[0.0, 1.0], [0.1, 0.0]])
    w = torch_peers.tinygemm_reference(codes, scales, zeros)
    assert w[0, 0] == 7 * 0.5 and w[1, 0] == -8 * 2.0 + 1.0
    assert w[1, k - 1] == -5 * 1.0 and w[0, k - 1] == -8 * 0.25 + 0.1


def test_profile_reads_the_log_by_subject(tmp_path: Path, monkeypatch, capsys) -> None:
    """The command re-enters the script in drive mode under ncu with a flushed L2; the log's
    rows between marker kernels become the subjects' rows, with the drive's device and checks."""
    labels = [{"K": 256, "N": 64, "M": m, "subject": s, "rel_error": 1e-3}
              for m in (1, 16) for s in torch_peers.SUBJECTS]
    commands = []

    def fake_run(cmd, **_):
        commands.append(cmd)
        lab = Path(cmd[cmd.index("--labels") + 1])
        lab.write_text(json.dumps({"device": "NVIDIA H200", "torch": "2.9.0", "labels": labels}))
        lines = ['"ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum"', '"","","nsecond","byte"']
        for i, label in enumerate(labels):
            lines += [f'"{3 * i}","mdsl_marker","1000","0"', f'"{3 * i + 1}","k_{label["subject"]}","{3000 + i}","512"',
                      f'"{3 * i + 2}","mdsl_marker","1000","0"']
        (tmp_path / "ncu.csv").write_text("==PROF== preamble\n" + "\n".join(lines) + "\n")
        return type("Done", (), {"returncode": 0, "stdout": "", "stderr": ""})()

    monkeypatch.setattr(torch_peers.subprocess, "run", fake_run)
    rc = torch_peers.main(["--out", str(tmp_path), "--shapes", "256x64", "--ms", "1,16",
                           "--labels", str(tmp_path / "labels.json")])
    assert rc == 0 and len(commands) == 1
    cmd = commands[0]
    assert cmd[0] == "ncu" and cmd[cmd.index("--cache-control") + 1] == "all" and "drive" in cmd
    result = json.loads((tmp_path / "torch_peers.json").read_text())
    assert result["device"] == "NVIDIA H200" and len(result["rows"]) == len(labels)
    for i, (row, label) in enumerate(zip(result["rows"], labels)):
        assert row["subject"] == label["subject"] and row["time_ns"] == 3000 + i and row["rel_error"] == 1e-3
    assert "torch_cusparselt_2of4" in capsys.readouterr().out
