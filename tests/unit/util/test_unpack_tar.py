"""fsutil.unpack_tar: a carried source archive (`pretrain: megatron: x.tar.gz`) lands inside its folder or not at
all, on Debian 12's Python 3.11.2 (no tarfile extraction filter) as on later ones (the "data" filter)."""

from __future__ import annotations

import io
import tarfile

import pytest

from mlrepro.util.fsutil import unpack_tar


def _archive(path, members):
    with tarfile.open(path, "w:gz") as tar:
        for name, kind, target in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                data = b"print('hi')\n"
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                info.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
                info.linkname = target
                tar.addfile(info)
    return path


def test_a_source_archive_unpacks_with_its_folders_and_links(tmp_path):
    archive = _archive(tmp_path / "src.tar.gz", [("pretrain_gpt.py", "file", None),
                                                 ("megatron/data/gpt_dataset.py", "file", None),
                                                 ("megatron/alias.py", "symlink", "data/gpt_dataset.py")])
    unpack_tar(archive, tmp_path / "out")
    assert (tmp_path / "out/pretrain_gpt.py").read_text() == "print('hi')\n"
    assert (tmp_path / "out/megatron/alias.py").read_text() == "print('hi')\n"


@pytest.mark.parametrize("member", [("../escaped.py", "file", None), ("/tmp/absolute_escape.py", "file", None),
                                    ("link", "symlink", "../../escaped.py"), ("link", "symlink", "/etc/passwd"),
                                    ("hard", "hardlink", "../escaped.py")])
def test_a_member_that_would_land_outside_is_refused(tmp_path, member):
    archive = _archive(tmp_path / "bad.tar.gz", [("ok.py", "file", None), member])
    (tmp_path / "out").mkdir()
    with pytest.raises(tarfile.TarError):
        unpack_tar(archive, tmp_path / "out")
    assert not (tmp_path / "escaped.py").exists() and not (tmp_path.parent / "escaped.py").exists()
