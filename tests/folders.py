"""Tests that damage an artifact folder work on a copy of it (the session's export is shared)."""
import shutil


def copy_of(folder, tmp_path):
    dst = tmp_path / "e"
    shutil.copytree(folder, dst)
    return dst
