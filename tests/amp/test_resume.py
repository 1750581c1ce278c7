"""Checkpoint model + optimizer + amp mid-run, resume in a fresh process: the resumed run continues
exactly like the uninterrupted one (same losses, same loss scales) on CPU."""

from __future__ import annotations

import json

import pytest
from amp_testlib import default_device, run_script

LEVELS = ["O0", "O1", "O2", "O3"]


# The workers train on this test's default device (the npu test device where torch's CPU has no
# float16: half_device), which they report.
@pytest.mark.half_device(in_worker=True)
def test_resume_in_fresh_process_continues_exactly(tmp_path):
    steps, save_at = 16, 7
    device = default_device().type
    full_out, resumed_out = tmp_path / "full.json", tmp_path / "resumed.json"
    common = [",".join(LEVELS), str(steps), str(save_at), str(tmp_path)]
    run_script("_resume_worker.py", "full", *common, str(full_out), device)
    run_script("_resume_worker.py", "resume", *common, str(resumed_out), device)
    full, resumed = json.loads(full_out.read_text()), json.loads(resumed_out.read_text())
    for level in LEVELS:
        assert full[level]["device"] == resumed[level]["device"] == device, level
        assert resumed[level]["losses"] == full[level]["losses"][save_at:], level
        assert resumed[level]["scales"] == full[level]["scales"][save_at:], level
    # The dynamic levels really had scaler state worth saving (skips and growth happened).
    for level in ("O1", "O2"):
        saved = full[level]["saved_amp"]["loss_scaler0"]
        assert saved["loss_scale"] < 2.0**24 or saved["unskipped"] > 0
        assert len(set(full[level]["scales"])) > 1
