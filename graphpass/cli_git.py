"""The review-in-git verbs of the command line (issue 24): textconv, diff as git's diff tool,
install-git, check-model, verify-changed, pr-comment; their parsers (:func:`add_git_verbs`,
called by :func:`graphpass.cli.build_parser`). The library side is :mod:`graphpass.gitint` and
:mod:`graphpass.diff.textconv`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from graphpass.cli import (_number_arg, _render_diff, _tolerance_arg, _write_text_atomic, error_text,
                           parse_size)
from graphpass.errors import GraphpassError, UsageError, VerificationError

__all__ = ["add_git_verbs", "cmd_git_diff"]


def cmd_textconv(args: argparse.Namespace) -> int:
    from graphpass.diff.textconv import textconv, textconv_stub

    try:
        text = textconv(args.model, canonical_names=args.canonical_names)
    except GraphpassError as e:
        if not args.lenient:
            raise
        # git runs textconv on every blob of `git log -p`: a failure would stop the whole log
        print(f"graphpass: warning: {error_text(e)}", file=sys.stderr)
        reason = str(e)
        if reason.startswith(f"{args.model}: "):  # git's temporary file names would show as changes
            reason = reason[len(args.model) + 2:]
        text = textconv_stub(args.model, reason)
    sys.stdout.write(text)
    return 0


def cmd_git_diff(args: argparse.Namespace) -> int:
    """``graphpass diff`` as git calls a diff tool: two files (difftool -x) or the seven
    GIT_EXTERNAL_DIFF arguments; /dev/null for an added or deleted model. Never exits non-zero
    for a model it cannot read in the seven-argument form (git would stop at that file)."""
    import tempfile

    from graphpass import gitint
    from graphpass.cost_model import create
    from graphpass.diff import diff_models

    create(args.target)
    sides = gitint.git_diff_args(args.before, args.after, args.git_args)
    external = bool(args.git_args)
    d = None
    if sides.old is None or sides.new is None:
        head = f"graphpass diff {sides.path}: {'added' if sides.old is None else 'deleted'} model\n"
        text = head + gitint.textconv_diff(sides, args.canonical_names)
    else:
        try:
            d = diff_models(sides.old, sides.new, target=args.target, names=(f"a/{sides.path}", f"b/{sides.path}")
                            if external else (sides.old, sides.new))
        except GraphpassError as e:
            if not external:
                raise
            text = (f"graphpass diff {sides.path}: structural diff not possible ({error_text(e)}); "
                    "the textconv texts instead\n" + gitint.textconv_diff(sides, args.canonical_names))
    if d is not None:
        text = _render_diff(d, args)
    if args.output:
        _write_text_atomic(Path(args.output), text)
    elif d is not None and args.format == "html" and (args.open or external):
        fd, name = tempfile.mkstemp(prefix="graphpass-diff-", suffix=".html")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"graphpass diff {sides.path}: wrote {name}")
        if not os.environ.get("GRAPHPASS_NO_BROWSER"):
            import webbrowser

            webbrowser.open(Path(name).as_uri())
    else:
        print(text, end="" if text.endswith("\n") else "\n")
    if external:
        return 0
    return 1 if args.exit_code and (d is None or not d.equivalent) else 0


def cmd_install_git(args: argparse.Namespace) -> int:
    from graphpass.gitint import install_git

    for line in install_git(".", global_=args.global_, uninstall=args.uninstall):
        print(line)
    return 0


def cmd_check_model(args: argparse.Namespace) -> int:
    from graphpass.gitint import check_model

    if args.min_opset is not None and args.max_opset is not None and args.min_opset > args.max_opset:
        raise UsageError(f"--min-opset {args.min_opset} is above --max-opset {args.max_opset}")
    max_size = args.max_size
    missing = [p for p in args.models if not os.path.exists(p)]
    if missing:
        raise UsageError(f"{missing[0]}: no such file")
    failed = 0
    for path in args.models:
        problems = check_model(path, max_size=max_size, min_opset=args.min_opset, max_opset=args.max_opset,
                               external_data=args.external_data)
        for p in problems:
            print(p)
        failed += bool(problems)
        if not problems and not args.quiet:
            print(f"{path}: ok")
    if failed:
        raise VerificationError(f"{failed} of {len(args.models)} models failed the check")
    return 0


def cmd_verify_changed(args: argparse.Namespace) -> int:
    from graphpass.gitint import verify_changed

    if not args.reference:
        if not args.quiet:
            print("graphpass verify-changed: no --reference configured: nothing to verify")
        return 0
    results = verify_changed(args.models, args.reference, rtol=args.rtol, atol=args.atol)
    for path, line, _ok in results:
        print(f"{path}: {line}")
    bad = sum(not ok for _, _, ok in results)
    if bad:
        raise VerificationError(f"{bad} of {len(results)} models do not match {args.reference}")
    return 0


def cmd_pr_comment(args: argparse.Namespace) -> int:
    from graphpass.cost_model import create
    from graphpass.gitint import pr_comment

    for t in args.target or []:
        create(t)
    if args.output:
        from graphpass.outputs import check_output_file

        check_output_file(args.output)
    comment, full = pr_comment(args.base, args.head, targets=args.target, limit=args.max_chars)
    if args.output:
        _write_text_atomic(Path(args.output), comment)
    else:
        sys.stdout.write(comment)
    if args.full:
        _write_text_atomic(Path(args.full), full)
    return 0


def add_git_verbs(sub, common) -> None:
    tc = sub.add_parser("textconv", parents=[common], help="canonical text of a model for git diff (textconv)")
    tc.add_argument("model")
    tc.add_argument("--canonical-names", action="store_true",
                    help="name tensors by structure (op and position), so a re-export that only renames diffs as nothing")
    tc.add_argument("--lenient", action="store_true",
                    help="for a file that is no model print its size and hash and exit 0 (what git's textconv needs)")
    tc.set_defaults(func=cmd_textconv)

    ig = sub.add_parser("install-git", parents=[common], help="set up git diff / log -p to show .onnx files as text")
    ig.add_argument("--global", dest="global_", action="store_true", help="for every repository of this user")
    ig.add_argument("--uninstall", action="store_true", help="remove what install-git writes")
    ig.set_defaults(func=cmd_install_git)

    cm = sub.add_parser("check-model", parents=[common], help="size / opset / external-data sanity check (pre-commit)")
    cm.add_argument("models", nargs="+")
    cm.add_argument("--max-size", type=parse_size, default=None, help="largest model file (default 2G, protobuf's limit), e.g. 100M")
    cm.add_argument("--min-opset", type=int, default=None)
    cm.add_argument("--max-opset", type=int, default=None, help="default: the newest the installed onnx knows")
    cm.add_argument("--external-data", choices=["allow", "forbid", "require"], default="allow")
    cm.set_defaults(func=cmd_check_model)

    vc = sub.add_parser("verify-changed", parents=[common],
                        help="verify changed models against their version at a git revision (pre-commit)")
    vc.add_argument("models", nargs="*")
    vc.add_argument("--reference", default=None, metavar="REV", help="git revision to verify against, e.g. HEAD")
    vc.add_argument("--rtol", type=_tolerance_arg, default=None)
    vc.add_argument("--atol", type=_tolerance_arg, default=None)
    vc.set_defaults(func=cmd_verify_changed)

    pc = sub.add_parser("pr-comment", parents=[common], help="Markdown of the .onnx changes for a pull-request comment")
    pc.add_argument("--base", required=True, metavar="REV", help="the pull request's base revision")
    pc.add_argument("--head", default=None, metavar="REV", help="default: the work tree")
    pc.add_argument("--target", action="append", default=None, help="cost-model target (repeatable)")
    pc.add_argument("--max-chars", type=_number_arg(int, lambda v: v >= 1000, "--max-chars is at least 1000"), default=65_000, help="comment size limit (default 65000)")
    pc.add_argument("-o", "--output", default=None, help="write the comment here")
    pc.add_argument("--full", default=None, metavar="FILE", help="write the full diff here (attach it when cut)")
    pc.set_defaults(func=cmd_pr_comment)


# ------------------------------------------------------------------------------------------
# parser
