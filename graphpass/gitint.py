"""Review where reviewers are: git textconv, difftool / external diff, install-git, pre-commit
hooks and the pull-request comment.

* :func:`install_git` writes ``*.onnx diff=onnx`` to ``.gitattributes`` (of the repository, or
  the global attributes file) and ``diff.onnx.textconv`` (+ ``cachetextconv``, ``binary``) to
  git config; idempotent; ``uninstall`` removes exactly what it would write.
* :func:`git_diff_args` reads the argument forms git calls a diff tool with: two files (``git
  difftool -x``) or the seven of ``GIT_EXTERNAL_DIFF`` (path old-file old-hex old-mode new-file
  new-hex new-mode); ``/dev/null`` stands for an added or deleted file.
* :func:`check_model` is the pre-commit sanity check (size, opsets, external data, loads);
  :func:`verify_changed` runs ``graphpass verify`` of each changed model against its version at
  a git revision.
* :func:`pr_comment` renders the Markdown of every .onnx file changed between two revisions for
  a pull-request comment, under GitHub's 65,536-character limit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator, Sequence

import onnx

from graphpass.errors import BadModelError, GraphpassError, UsageError

__all__ = ["install_git", "git_diff_args", "GitDiffArgs", "check_model", "verify_changed", "pr_comment",
           "model_at", "COMMENT_LIMIT", "ATTRIBUTE_LINE"]

#: The line ``install-git`` writes to ``.gitattributes``.
ATTRIBUTE_LINE = "*.onnx diff=onnx"
#: A pull-request comment stays under this many characters (GitHub refuses bodies over 65,536).
COMMENT_LIMIT = 65_000
NULL = os.devnull


class GitError(UsageError):
    """git is missing, the folder is no repository, or a git command failed."""


def _git(args: Sequence[str], cwd: str | os.PathLike | None = None, check: bool = True,
         binary: bool = False) -> subprocess.CompletedProcess:
    if shutil.which("git") is None:
        raise GitError("git is not installed (not found on PATH)")
    p = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=not binary)
    if check and p.returncode != 0:
        err = p.stderr.decode("utf-8", "replace") if binary else p.stderr
        raise GitError(f"git {' '.join(args)}: {(err.strip().splitlines() or ['failed'])[-1]}")
    return p


# -- install-git -------------------------------------------------------------------------------

def _config_values(textconv_cmd: str) -> list[tuple[str, str]]:
    return [("diff.onnx.textconv", textconv_cmd), ("diff.onnx.cachetextconv", "true"), ("diff.onnx.binary", "true")]


def _attributes_file(repo: Path | None, global_: bool) -> Path:
    if not global_:
        return repo / ".gitattributes"
    p = _git(["config", "--global", "--get", "core.attributesFile"], check=False)
    if p.returncode == 0 and p.stdout.strip():
        return Path(os.path.expanduser(p.stdout.strip()))
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(xdg) / "git" / "attributes"  # git's default global attributes file


def install_git(repo: str | os.PathLike | None = None, global_: bool = False, uninstall: bool = False,
                textconv_cmd: str = "graphpass textconv --lenient") -> list[str]:
    """Set up (or with ``uninstall`` remove) git's textconv for .onnx files; returns what it did,
    one line per action ("already ..." when there was nothing to do: it is idempotent).

    Raises:
        GitError: git is not installed, or ``repo`` is not inside a git work tree (without ``global_``).
    """
    done: list[str] = []
    top: Path | None = None
    if not global_:
        p = _git(["rev-parse", "--show-toplevel"], cwd=repo or ".", check=False)
        if p.returncode != 0:
            raise GitError(f"{Path(repo or '.').resolve()}: not inside a git work tree (install it globally to set it up for every repository)")
        top = Path(p.stdout.strip())
    scope = ["--global"] if global_ else []
    where = "global git config" if global_ else f"{top}/.git/config"
    for key, value in _config_values(textconv_cmd):
        cur = _git(["config", *scope, "--get", key], cwd=top, check=False)
        current = cur.stdout.strip() if cur.returncode == 0 else None
        if uninstall:
            if current is None:
                done.append(f"already absent: {key} in {where}")
            else:
                _git(["config", *scope, "--unset-all", key], cwd=top)
                done.append(f"removed {key} from {where}")
        elif current == value:
            done.append(f"already set: {key} = {value} in {where}")
        else:
            _git(["config", *scope, key, value], cwd=top)
            done.append(f"set {key} = {value} in {where}" + (f" (was {current!r})" if current is not None else ""))
    if uninstall:
        with contextlib.suppress(GitError):  # the section is empty now: leave no "[diff "onnx"]" behind
            if _git(["config", *scope, "--get-regexp", r"^diff\.onnx\."], cwd=top, check=False).returncode != 0:
                _git(["config", *scope, "--remove-section", "diff.onnx"], cwd=top, check=False)
    attrs = _attributes_file(top, global_)
    text = attrs.read_text(encoding="utf-8") if attrs.is_file() else ""
    lines = text.splitlines()
    present = [ln for ln in lines if ln.strip() == ATTRIBUTE_LINE]
    if uninstall:
        if present:
            kept = [ln for ln in lines if ln.strip() != ATTRIBUTE_LINE]
            _write(attrs, "".join(ln + "\n" for ln in kept))
            done.append(f"removed '{ATTRIBUTE_LINE}' from {attrs}")
        else:
            done.append(f"already absent: '{ATTRIBUTE_LINE}' in {attrs}")
    elif present:
        done.append(f"already present: '{ATTRIBUTE_LINE}' in {attrs}")
    else:
        sep = "" if not text or text.endswith("\n") else "\n"
        _write(attrs, text + sep + ATTRIBUTE_LINE + "\n")
        done.append(f"added '{ATTRIBUTE_LINE}' to {attrs}")
    return done


def _write(path: Path, text: str) -> None:
    from graphpass.ir.files import write_text_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text)


# -- git's diff-tool calling conventions ---------------------------------------------------------

@dataclasses.dataclass
class GitDiffArgs:
    """Two sides to diff: files (``None`` for an added/deleted side) and the name to show."""

    path: str
    old: str | None
    new: str | None


def git_diff_args(before: str, after: str, rest: Sequence[str]) -> GitDiffArgs:
    """The sides of a diff from the arguments git passes: ``before after`` (difftool -x) or the
    seven of GIT_EXTERNAL_DIFF (``before`` is the path, ``after`` the old file, ``rest`` the other
    five; seven for a rename: the new path and the similarity message). ``/dev/null`` is an absent side.

    Raises:
        UsageError: another number of arguments.
    """
    if not rest:
        return GitDiffArgs(after if before == NULL else before,
                           None if before == NULL else before, None if after == NULL else after)
    if len(rest) not in (5, 7):
        raise UsageError(f"diff takes two models, or the seven arguments git passes an external diff "
                         f"(path old-file old-hex old-mode new-file new-hex new-mode; nine for a rename); "
                         f"got {2 + len(rest)}")
    path, old, _old_hex, _old_mode, new, _new_hex, _new_mode = before, after, *rest[:5]
    if len(rest) == 7:  # a rename or copy: the new path and git's "similarity index" message follow
        path = f"{path} => {rest[5]}"
    return GitDiffArgs(path, None if old == NULL else old, None if new == NULL else new)


def textconv_diff(sides: GitDiffArgs, canonical_names: bool = False) -> str:
    """A unified diff of the two sides' textconv texts (what ``git diff`` shows through textconv);
    the fallback when the structural diff cannot read a side (e.g. its external data is not next
    to git's temporary copy)."""
    from graphpass.diff.textconv import textconv, textconv_stub

    def text(p: str | None) -> list[str]:
        if p is None:
            return []
        try:
            return textconv(p, canonical_names).splitlines(keepends=True)
        except GraphpassError as e:
            return textconv_stub(p, str(e)).splitlines(keepends=True)

    return "".join(difflib.unified_diff(text(sides.old), text(sides.new), f"a/{sides.path}", f"b/{sides.path}"))


# -- files at a revision ---------------------------------------------------------------------------

@contextlib.contextmanager
def model_at(rev: str, path: str | os.PathLike, cwd: str | os.PathLike | None = None) -> Iterator[Path | None]:
    """The model at ``path`` as it is in revision ``rev``, written to a temporary folder with the
    external data files it names (taken from the same revision); None when ``rev`` has no such
    file. The folder is removed on exit."""
    top = Path(_git(["rev-parse", "--show-toplevel"], cwd=cwd or ".").stdout.strip())
    rel = Path(os.path.relpath(Path(path).resolve(), top.resolve())).as_posix()
    blob = _git(["show", f"{rev}:{rel}"], cwd=top, check=False, binary=True)
    if blob.returncode != 0:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="graphpass-git-") as tmp:
        dest = Path(tmp) / Path(rel).name
        dest.write_bytes(blob.stdout)
        m: onnx.ModelProto | None = onnx.ModelProto()
        try:
            m.ParseFromString(blob.stdout)
        except Exception:  # noqa: BLE001 - not a model: the caller's loader says so
            m = None
        if m is not None:
            from graphpass.ir.external import _external_tensors

            locations = {e.value for t in _external_tensors(m) for e in t.external_data if e.key == "location"}
            folder = Path(rel).parent
            for loc in sorted(locations):
                if os.path.isabs(loc) or ".." in Path(loc).parts:
                    continue  # the loader refuses these itself, with its reason
                data = _git(["show", f"{rev}:{(folder / loc).as_posix()}"], cwd=top, check=False, binary=True)
                if data.returncode == 0:
                    (Path(tmp) / loc).parent.mkdir(parents=True, exist_ok=True)
                    (Path(tmp) / loc).write_bytes(data.stdout)
        yield dest


def changed_models(base: str, head: str | None = None, cwd: str | os.PathLike | None = None) -> list[tuple[str, str]]:
    """(status, path) of the .onnx files that differ between ``base`` and ``head`` (None: the
    work tree), renames split into a deletion and an addition; paths relative to the top."""
    args = ["diff", "--name-status", "--no-renames", "-z", base] + ([head] if head else []) + ["--", "*.onnx"]
    out = _git(args, cwd=cwd).stdout.split("\0")
    pairs = [(out[i], out[i + 1]) for i in range(0, len(out) - 1, 2) if out[i]]
    return sorted((s[0], p) for s, p in pairs)


@contextlib.contextmanager
def _model_in(rev: str | None, path: str, top: Path) -> Iterator[Path | None]:
    if rev is None:
        p = top / path
        yield p if p.exists() else None
    else:
        with model_at(rev, top / path, cwd=top) as p:
            yield p


# -- pre-commit: check-model and verify-changed ----------------------------------------------------

def check_model(path: str | os.PathLike, max_size: int | None = None, min_opset: int | None = None,
                max_opset: int | None = None, external_data: str = "allow") -> list[str]:
    """What is wrong with the model file at ``path`` for committing it, one line each (empty: fine).

    Checks: the file (without external data) is at most ``max_size`` bytes (default: protobuf's
    2 GiB limit) and parses; it validates as ``graphpass load`` validates; the default-domain opset
    lies in ``min_opset``..``max_opset`` (default: up to what the installed onnx knows);
    ``external_data``: "allow" (the files exist next to the model, in its folder, and hold the byte
    ranges named), "forbid" (none), or "require" (every weight over 1 KiB is external).
    """
    from graphpass.ir.external import _external_tensors, _load_external_data
    from graphpass.ir.validate import _validate_at, parse

    p = Path(path)
    limit = max_size if max_size is not None else (1 << 31) - 1
    try:
        size = p.stat().st_size
    except OSError as e:
        return [f"{p}: cannot read: {e.strerror}"]
    if not p.is_file():
        return [f"{p}: not a regular file"]
    if size > limit:
        return [f"{p}: {size:,} bytes, over the limit of {limit:,} (move weights to external data, or raise the size limit)"]
    problems: list[str] = []
    try:
        model = parse(p.read_bytes(), str(p))
    except BadModelError as e:
        return [str(e)]
    ext = list(_external_tensors(model))
    if external_data == "forbid" and ext:
        problems.append(f"{p}: {len(ext)} tensors in external data, which this repository forbids")
    if external_data == "require":
        inline = [t.name for t in model.graph.initializer if t.name and t not in ext and len(t.raw_data) > 1024]
        if inline:
            problems.append(f"{p}: {len(inline)} weights over 1 KiB stored inline (first: {inline[0]}); "
                            "this repository wants them in external data")
    if ext:
        try:
            _load_external_data(model, p.resolve().parent, str(p), lazy=True)
        except BadModelError as e:
            problems.append(str(e))
            return problems
    try:
        _validate_at(model, str(p))
    except BadModelError as e:
        problems.append(str(e))
    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    top = onnx.defs.onnx_opset_version()
    hi = max_opset if max_opset is not None else top
    if version is not None and version > hi:
        problems.append(f"{p}: opset {version} is above {hi}" + (" (the newest the installed onnx knows)"
                                                                  if max_opset is None else ""))
    if version is not None and min_opset is not None and version < min_opset:
        problems.append(f"{p}: opset {version} is below the required {min_opset}")
    return problems


def verify_changed(paths: Sequence[str], reference: str, rtol: float | None = None, atol: float | None = None,
                   seed: int = 0) -> list[tuple[str, str, bool]]:
    """``graphpass verify`` of each model in ``paths`` against its version at git revision
    ``reference``: (path, one-line result, ok). A model the revision does not hold (new), or one
    whose inputs/outputs changed, is reported and not failed: there is nothing to compare."""
    from graphpass.check import verify as V

    out: list[tuple[str, str, bool]] = []
    for path in paths:
        with model_at(reference, path) as old:
            if old is None:
                out.append((path, f"new at {reference}: nothing to verify against", True))
                continue
            try:
                a, b = onnx.load(str(old), load_external_data=False), onnx.load(str(path), load_external_data=False)
            except Exception as e:  # noqa: BLE001 - a broken file: the sanity hook says why
                out.append((path, f"cannot read: {str(e).splitlines()[0] if str(e) else type(e).__name__}", False))
                continue
            if [i.name for i in a.graph.input] != [i.name for i in b.graph.input] or \
                    [o.name for o in a.graph.output] != [o.name for o in b.graph.output]:
                out.append((path, f"inputs or outputs differ from {reference}: not verified (review the diff)", True))
                continue
            try:
                r = V.verify_models(str(old), str(path), seed=seed, rtol=rtol, atol=atol)
            except GraphpassError as e:
                out.append((path, f"cannot verify: {e}", False))
                continue
            bad = [c for c in r.outputs if not c.ok]
            if bad:
                out.append((path, f"{len(bad)} of {len(r.outputs)} outputs differ from {reference}", False))
            else:
                out.append((path, f"outputs match {reference} ({len(r.outputs)} outputs)", True))
    return out


# -- the pull-request comment ----------------------------------------------------------------------

def _cost_per_target(path: Path | None, targets: Sequence[str]) -> dict[str, float | None]:
    from graphpass.diff.core import COST_MAX_NODES, _node_costs
    from graphpass.ir.model import as_proto

    out: dict[str, float | None] = {t: None for t in targets}
    if path is None:
        return out
    try:
        proto = as_proto(str(path), stored=True)
    except GraphpassError:
        return out
    if len(proto.graph.node) > COST_MAX_NODES:
        return out
    for t in targets:
        if t == "none":
            continue
        r = _node_costs(proto, t)
        if r is not None:
            out[t] = r[1].total_us
    return out


def _cost_cell(a: float | None, b: float | None) -> str:
    if a is None and b is None:
        return "-"
    if a is None or b is None:
        return f"{'-' if a is None else f'{a:,.1f}'} → {'-' if b is None else f'{b:,.1f}'}"
    pct = f" ({(b - a) / a:+.1%})" if a else ""
    return f"{a:,.1f} → {b:,.1f}{pct}"


def pr_comment(base: str, head: str | None = None, targets: Sequence[str] | None = None,
               limit: int = COMMENT_LIMIT, cwd: str | os.PathLike | None = None) -> tuple[str, str]:
    """(comment, full): the Markdown comment for the .onnx files changed from ``base`` to ``head``
    (None: the work tree) and the full diff. The comment opens with one summary table (nodes,
    ops changed, estimated cost per target, output signature changes), then each model's diff in
    a ``<details>`` block; when that is over ``limit`` characters the details are cut to fit and
    the comment says where the full diff is (the workflow attaches ``full`` as a file)."""
    from graphpass.cost_model.target import DEFAULT_TARGET
    from graphpass.diff import diff_models, to_markdown

    targets = list(targets) if targets else [DEFAULT_TARGET]
    top = Path(_git(["rev-parse", "--show-toplevel"], cwd=cwd or ".").stdout.strip())
    files = changed_models(base, head, cwd=top)
    head_label = head or "work tree"
    cost_cols = [t for t in targets if t != "none"]
    header = ["## graphpass: model changes", "",
              f"{len(files)} ONNX model{'s' if len(files) != 1 else ''} changed ({base} → {head_label}). "
              "Costs are cost-model estimates, not measurements.", ""]
    table = ["| model | change | nodes | ops changed | outputs |" + "".join(f" est. µs {t} |" for t in cost_cols),
             "|---|---|---:|---|---|" + "---:|" * len(cost_cols)]
    details: list[str] = []
    for status, path in files:
        with _model_in(base, path, top) as old, _model_in(head, path, top) as new:
            costs_a = _cost_per_target(old, cost_cols)
            costs_b = _cost_per_target(new, cost_cols)
            costs = "".join(f" {_cost_cell(costs_a[t], costs_b[t])} |" for t in cost_cols)
            if old is None or new is None:
                what = "added" if old is None else "removed"
                table.append(f"| `{path}` | {what} | - | - | - |{costs}")
                continue
            try:
                d = diff_models(str(old), str(new), target="none", names=(f"{base}:{path}", f"{head_label}:{path}"))
            except GraphpassError as e:
                table.append(f"| `{path}` | unreadable | - | - | - |{costs}")
                details.append(f"<details><summary><code>{path}</code>: not diffed</summary>\n\n{e}\n\n</details>\n")
                continue
            ops = ", ".join(f"{op} {a}→{b}" for op, (a, b) in list(d.ops.items())[:6]) + (" …" if len(d.ops) > 6 else "")
            outs = d.outputs
            n_out = sum(len(outs.get(k, [])) for k in ("removed", "added", "changed", "renamed", "rewired"))
            change = "no change" if d.equivalent else "modified"
            table.append(f"| `{path}` | {change} | {len(d.before.nodes)} → {len(d.after.nodes)} | {ops or '-'} | "
                         f"{'unchanged' if not n_out else f'{n_out} changed'} |{costs}")
            body = to_markdown(d).split("\n", 1)[-1]
            details.append(f"<details><summary><code>{path}</code>: diff</summary>\n\n{body}\n</details>\n")
    full = "\n".join(header + table + [""] + details)
    if len(full) <= limit:
        return full, full
    note = ("\n> The full diff is over the comment limit: it is attached to this workflow run as "
            "`graphpass-diff-full.md`. Below, the diffs that fit.\n")
    room = limit - len("\n".join(header + table)) - len(note) - 200
    kept: list[str] = []
    for d in details:
        if len(d) > room:
            break
        kept.append(d)
        room -= len(d) + 1
    cut = len(details) - len(kept)
    comment = "\n".join(header + table + [note] + kept + ([f"_{cut} more model diffs in the attached file._"] if cut else []))
    if len(comment) > limit:  # the table alone is too long: keep its head
        comment = comment[:limit - 120].rsplit("\n", 1)[0] + "\n\n_… cut to fit: see the attached full diff._\n"
    return comment, full
