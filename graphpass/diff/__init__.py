"""``graphpass diff BEFORE AFTER``: a before/after graph diff fit for code review.

    from graphpass.diff import diff_models, to_markdown
    d = diff_models("model.onnx", "model.opt.onnx")
    print(to_markdown(d))

Matching (``match.py``), grouping into rewrites with cost deltas (``core.py``), text/Markdown/
JSON rendering (``render.py``, JSON schema ``graphpass.diff/1`` documented there) and a
self-contained HTML page with before/after pictures (``html.py``).
"""

from graphpass.diff.core import GraphDiff, Rewrite, diff_graphs, diff_models
from graphpass.diff.html import to_html
from graphpass.diff.render import SCHEMA, to_dict, to_json, to_markdown, to_text

__all__ = ["GraphDiff", "Rewrite", "diff_graphs", "diff_models", "to_html", "to_dict", "to_json", "to_markdown",
           "to_text", "SCHEMA"]
