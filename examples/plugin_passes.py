"""A plugin: a user's own pass, written with graphpass's pass API, run by ``graphpass optimize``.

    graphpass optimize model.onnx -o out.onnx --plugin examples/plugin_passes.py

Relu is idempotent, so ``Relu(Relu(x)) => Relu(x)`` (exact: bitwise the same on every input,
NaN, -0.0 and inf included). The rule is one line of the rewrite API (``passes/framework/rewrite.py``);
``rule_pass(..., register=True)`` makes it a registered pass. ``default_enabled`` (the default) puts
it in the default pipeline, at the position ``runs_before`` declares: before the fusions, which
would otherwise fold the second Relu into its Conv and leave the first.

A distribution ships the same module to every user through an entry point (pyproject.toml):

    [project.entry-points."graphpass.passes"]
    relu_relu = "my_package.plugin_passes"

An entry point may also name a Pass class, or a list of them; a module may list unregistered
Pass classes in ``PASSES``. ``graphpass passes --plugin examples/plugin_passes.py`` lists it.
"""

from graphpass.passes.framework.pass_base import EXACT, PassKind
from graphpass.passes.framework.rewrite import rule, rule_pass

collapse_relu_relu = rule(("Relu", "Relu"), lambda m: m.op("Relu", [m.nodes[0].inputs[0]]), name="relu_relu")

CollapseReluRelu = rule_pass(
    "collapse_relu_relu",
    [collapse_relu_relu],
    summary="Relu(Relu(x)) => Relu(x) (an example plugin: examples/plugin_passes.py)",
    kind=PassKind.CLEANUP,
    promise=EXACT,
    runs_before=(PassKind.FUSION,),
    register=True,
    module=__name__,
)
