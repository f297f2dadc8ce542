"""A rerun that computes the same numbers at another commit keeps the shipped file byte for byte (issue 35)."""

from __future__ import annotations

import json

from bandit.logs import outputs


def test_a_rerun_at_another_commit_keeps_the_file(tmp_path):
    p = tmp_path / "ci.json"
    old = json.dumps({"code_version": "0.1.0+gc436a9216e35", "x": 1.5}) + "\n"
    p.write_text(old)
    outputs.write_all([(p, json.dumps({"code_version": "0.1.0+gd7549cfad728", "x": 1.5}) + "\n")])
    assert p.read_text() == old  # same numbers: the stamp of the commit that computed them stays


def test_a_change_in_numbers_is_written_with_the_new_stamp(tmp_path):
    p = tmp_path / "replay.txt"
    p.write_text("# made by: python bandit/replay.py\nmean 1.50; code 0.1.0+gc436a9216e35\n")
    new = "# made by: python bandit/replay.py\nmean 1.51; code 0.1.0+gd7549cfad728\n"
    outputs.write_all([(p, new)])
    assert p.read_text() == new


def test_the_stamp_is_the_only_thing_ignored(tmp_path):
    assert outputs.same_numbers(tmp_path / "absent", b"x") is False
    p = tmp_path / "a.txt"
    p.write_bytes(b"code 0.1.0+gaaaaaaaaaaaa v 2")
    assert outputs.same_numbers(p, b"code 0.1.0+gbbbbbbbbbbbb v 2")
    assert not outputs.same_numbers(p, b"code 0.1.0+gbbbbbbbbbbbb v 3")
    assert not outputs.same_numbers(p, b"code 0.2.0+gaaaaaaaaaaaa v 2")  # a package version is not a stamp


def test_a_command_says_what_it_wrote_and_what_it_kept(tmp_path):
    """write_all returns only the files it wrote: a rerun that keeps a shipped file must not say it wrote it."""
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("v 2; code 0.1.0+gaaaaaaaaaaaa\n")
    done = outputs.write_all([(a, "v 2; code 0.1.0+gbbbbbbbbbbbb\n"), (b, "v 3\n")])
    assert done == [b] and a.read_text() == "v 2; code 0.1.0+gaaaaaaaaaaaa\n"
    assert outputs.wrote([a, b], done) == f"wrote {b}; kept {a}: the same numbers\n"
    assert outputs.wrote([a, b], []) == f"kept {a} and {b}: the same numbers\n"
    c = tmp_path / "c.txt"
    assert outputs.wrote([a, b, c], [a, b, c]) == f"wrote {a}, {b} and {c}\n"
    assert outputs.write_all([(a, "v 2; code 0.1.0+gbbbbbbbbbbbb\n")], stamps=True) == [a]
