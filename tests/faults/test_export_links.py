"""pofe export of a run folder: a planted link in the folder is refused, never read."""

import json

from _cli import invoke


def test_export_of_a_run_folder_never_reads_a_planted_link(tmp_path):
    secret = tmp_path / "secret.jsonl"
    secret.write_text(json.dumps({"prompt": "P", "chosen": "a", "rejected": "b"}) + "\n")
    run = tmp_path / "run"; run.mkdir()
    (run / "config.yaml").write_text("{}\n")
    (run / "preferences.jsonl").symlink_to(secret)
    res = invoke("export", str(run), "-o", str(tmp_path / "out.jsonl"))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "link" in (res.stdout + res.stderr).lower()
    assert not (tmp_path / "out.jsonl").exists()
