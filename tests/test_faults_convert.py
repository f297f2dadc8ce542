"""Fault cases of `convert-checkpoint` and of pickle-only drafter directories (issue 24): no write through a
symlink, dangling or not, never an overwrite, and the hint to convert where only pickles stand."""

from __future__ import annotations

import os

import pytest
import torch

from harness.models import convert
from harness.models.lm import HarnessError, resolve_model_dir


@pytest.fixture
def src(tmp_path):
    d = tmp_path / "src"
    d.mkdir()
    torch.save({"w": torch.ones(2, 3)}, d / "pytorch_model.bin")
    (d / "config.json").write_text('{"hidden_size": 3}')
    return d


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_dangling_symlink_in_the_output_is_not_written_through(tmp_path, src, name):
    dst = tmp_path / "dst"
    dst.mkdir()
    victim = tmp_path / "elsewhere" / "victim"
    os.symlink(victim, dst / name)
    with pytest.raises(HarnessError, match="already exists; convert-checkpoint never overwrites"):
        convert.convert_checkpoint(src, dst)
    assert not victim.exists() and not victim.parent.exists()
    assert [p.name for p in dst.iterdir()] == [name]  # nothing else written either


def test_a_symlinked_destination_is_refused(tmp_path, src):
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "dst")
    with pytest.raises(HarnessError, match="is a symlink"):
        convert.convert_checkpoint(src, tmp_path / "dst")
    assert list(real.iterdir()) == []


def test_a_file_appearing_meanwhile_is_kept(tmp_path, src, monkeypatch):
    """A file put at the output between the check and the write is not replaced (the write refuses it)."""
    dst = tmp_path / "dst"
    real = convert.read_pickled

    def and_then_a_file(path):
        dst.mkdir(exist_ok=True)
        (dst / "model.safetensors").write_text("theirs")
        return real(path)

    monkeypatch.setattr(convert, "read_pickled", and_then_a_file)
    with pytest.raises(HarnessError, match="never overwrites"):
        convert.convert_checkpoint(src, dst)
    assert (dst / "model.safetensors").read_text() == "theirs"


def test_a_pickle_only_drafter_directory_names_convert_checkpoint(src):
    with pytest.raises(HarnessError, match=r"no \*\.safetensors weights.*convert-checkpoint .*src DST"):
        resolve_model_dir(str(src), None, "--drafter draft:path")
    convert.convert_checkpoint(src, src)
    assert resolve_model_dir(str(src), None, "--drafter draft:path") == src
