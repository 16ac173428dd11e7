"""``graphpass install-git``: .gitattributes and git config, idempotent, --global, --uninstall."""

from __future__ import annotations

from gitrepo import graphpass_cmd, repo  # noqa: F401 - repo: the fixture


def test_install_is_idempotent_and_uninstall_removes_it(repo):
    (repo.path / ".gitattributes").write_text("*.png binary")  # no trailing newline: kept intact
    p = repo.run(*graphpass_cmd("install-git"), check=True)
    assert "added '*.onnx diff=onnx'" in p.stdout and "set diff.onnx.textconv" in p.stdout
    assert (repo.path / ".gitattributes").read_text() == "*.png binary\n*.onnx diff=onnx\n"
    assert repo.git("config", "diff.onnx.textconv").stdout.strip() == "graphpass textconv --lenient"
    assert repo.git("config", "diff.onnx.cachetextconv").stdout.strip() == "true"
    assert repo.git("check-attr", "diff", "--", "x/m.onnx").stdout.strip().endswith("diff: onnx")
    config = (repo.path / ".git" / "config").read_text()
    again = repo.run(*graphpass_cmd("install-git"), check=True)
    assert all(line.startswith("already") for line in again.stdout.splitlines()), again.stdout
    assert (repo.path / ".gitattributes").read_text() == "*.png binary\n*.onnx diff=onnx\n"
    assert (repo.path / ".git" / "config").read_text() == config
    gone = repo.run(*graphpass_cmd("install-git", "--uninstall"), check=True)
    assert "removed '*.onnx diff=onnx'" in gone.stdout
    assert (repo.path / ".gitattributes").read_text() == "*.png binary\n"
    assert repo.git("config", "diff.onnx.textconv", check=False).returncode == 1
    assert "[diff \"onnx\"]" not in (repo.path / ".git" / "config").read_text()
    twice = repo.run(*graphpass_cmd("install-git", "--uninstall"), check=True)
    assert all(line.startswith("already absent") for line in twice.stdout.splitlines())


def test_install_from_a_subfolder_writes_the_top_level_attributes(repo):
    (repo.path / "models").mkdir()
    p = repo.run(*graphpass_cmd("install-git"), check=False)
    sub = __import__("subprocess").run(graphpass_cmd("install-git"), cwd=repo.path / "models", env=repo.env,
                                       capture_output=True, text=True)
    assert p.returncode == 0 and sub.returncode == 0
    assert not (repo.path / "models" / ".gitattributes").exists()
    assert (repo.path / ".gitattributes").read_text().count("*.onnx diff=onnx") == 1


def test_global_install_and_uninstall(repo, tmp_path):
    p = repo.run(*graphpass_cmd("install-git", "--global"), check=True)
    attrs = tmp_path / "home" / ".config" / "git" / "attributes"
    assert attrs.read_text() == "*.onnx diff=onnx\n", p.stdout
    assert repo.git("config", "--global", "diff.onnx.textconv").stdout.strip() == "graphpass textconv --lenient"
    assert not (repo.path / ".gitattributes").exists()
    assert repo.git("check-attr", "diff", "--", "m.onnx").stdout.strip().endswith("diff: onnx")
    assert all(ln.startswith("already") for ln in repo.run(*graphpass_cmd("install-git", "--global")).stdout.splitlines())
    repo.run(*graphpass_cmd("install-git", "--global", "--uninstall"), check=True)
    assert attrs.read_text() == ""
    assert repo.git("config", "--global", "diff.onnx.textconv", check=False).returncode == 1


def test_outside_a_repository_is_one_line_exit_2(tmp_path):
    import subprocess

    from gitrepo import git_env

    (tmp_path / "plain").mkdir()
    p = subprocess.run(graphpass_cmd("install-git"), cwd=tmp_path / "plain", env=dict(git_env(tmp_path / "h"),
                       GIT_CEILING_DIRECTORIES=str(tmp_path)), capture_output=True, text=True)
    assert p.returncode == 2 and "not inside a git work tree" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not (tmp_path / "plain" / ".gitattributes").exists()
